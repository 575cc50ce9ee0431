//! Byte assembly: a payload's gzip form as the fragments' deflate pieces joined in groups with a
//! combined CRC-32, and its identity form as the fragments' shared bytes.
//!
//! The pieces are joined a group of applications at a time, and a group is joined again only
//! when one of its pieces changed: a write then copies the group it changed and combines one
//! CRC-32 per group, not the whole payload (1.26 MB at 50,000 instances, 0.16-0.26 ms of every
//! build, 2026-12-04). The groups are sent as they are, one after the other. They are large
//! (about [`GROUP_BYTES`]): groups of about 32 applications (16 KB) cost a fetch at 50k 46 % more
//! CPU (388 against 265 ms per 1,000 closed-loop fetches, 2026-12-04), likely because hyper
//! writes to the socket each time its 64 KB buffer fills.

use std::collections::HashMap;

use super::*;

/// About one application in this many starts a group (chosen by a hash of its name, so that an
/// application added or removed moves no other group's bounds but its own and the next's).
const GROUP_APPS: u64 = if cfg!(test) { 8 } else { 512 };

/// A group also ends once its pieces reach this many bytes, so that a write to a registry of
/// large applications copies about this much.
const GROUP_BYTES: usize = if cfg!(test) { 4096 } else { 256 * 1024 };

/// Whether the application called `name` starts a group (FNV-1a of its name).
pub(super) fn starts_group(name: &str) -> bool {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h.is_multiple_of(GROUP_APPS)
}

/// Consecutive fragments' pieces joined, with the CRC-32 of their text.
pub(super) struct Group {
    /// The pieces it was joined from, held so that their buffers stay alive: a piece compressed
    /// since cannot be allocated where one of these is, so comparing addresses is exact.
    pieces: Vec<Bytes>,
    /// Whether it ends the document (its last piece is not followed by the separator).
    last: bool,
    joined: Bytes,
    sum: Sum,
}

/// The groups of the last build, by the address of their first piece.
pub(super) type Groups = HashMap<usize, Group>;

/// The gzip form of a payload: a header with the head as a stored block, the groups of
/// fragments' deflated pieces (each with the separator in its closing block), and the tail with
/// a trailer whose CRC-32 is combined from the groups' own. Also the time the oldest fragment
/// was encoded. Groups whose pieces did not change since the last build are reused.
pub(super) fn gzip_body(fragments: &mut Fragments, head: &[u8], tail: &[u8], sep: &[u8]) -> (Pieces, Instant) {
    let sep_block = separator_block(sep);
    let mut previous = std::mem::take(&mut fragments.groups);
    let mut groups = Groups::with_capacity(previous.len());
    let mut parts = Vec::with_capacity(previous.len() + 2);
    let mut first = gzip::HEADER.to_vec();
    first.extend_from_slice(&gzip::stored(head));
    parts.push(Bytes::from(first));
    let mut sum = Sum::of(head);
    let mut oldest = Instant::now();
    let mut members: Vec<&Fragment> = Vec::new();
    let mut bytes = 0;
    let mut close = |members: &mut Vec<&Fragment>, last: bool| {
        let group = join(members, last, &mut previous, &sep_block, sep);
        parts.push(group.joined.clone());
        sum = sum.then(group.sum);
        groups.insert(members[0].deflated.as_ptr() as usize, group);
        members.clear();
    };
    for f in fragments.map.values() {
        oldest = oldest.min(f.taken);
        if !members.is_empty() && (f.starts_group || bytes >= GROUP_BYTES) {
            close(&mut members, false);
            bytes = 0;
        }
        members.push(f);
        bytes += f.deflated.len();
    }
    if !members.is_empty() {
        close(&mut members, true);
    }
    let sum = sum.then(Sum::of(tail));
    let mut end = gzip::stored(tail);
    end.extend_from_slice(&gzip::trailer(sum));
    parts.push(Bytes::from(end));
    fragments.groups = groups;
    (Pieces::new(parts), oldest)
}

/// The group of `members`: the one of the last build if it holds the same pieces, else joined.
fn join(members: &[&Fragment], last: bool, previous: &mut Groups, sep_block: &[u8], sep: &[u8]) -> Group {
    if let Some(g) = previous.remove(&(members[0].deflated.as_ptr() as usize))
        && g.last == last
        && (crate::mutants::on("stale-payload-group")
            || (g.pieces.len() == members.len() && g.pieces.iter().zip(members).all(|(p, f)| shared(p, &f.deflated))))
    {
        return g;
    }
    let size = members.iter().map(|f| f.deflated.len() + sep_block.len()).sum();
    let mut joined = Vec::with_capacity(size);
    let mut sum = Sum::EMPTY;
    for (i, f) in members.iter().enumerate() {
        let end = last && i + 1 == members.len();
        sum = sum.then(if end { f.plain } else { f.separated });
        if end || sep.is_empty() {
            joined.extend_from_slice(&f.deflated);
        } else {
            // The piece's closing empty stored block becomes one holding the separator.
            joined.extend_from_slice(&f.deflated[..f.deflated.len() - gzip::SYNC_TAIL.len()]);
            joined.extend_from_slice(sep_block);
        }
    }
    Group {
        pieces: members.iter().map(|f| f.deflated.clone()).collect(),
        last,
        joined: Bytes::from(joined),
        sum,
    }
}

/// The uncompressed form of a payload as shared pieces: the head, each fragment's text (kept, or
/// inflated once from its piece), the last without its separator, and the tail.
pub(super) fn identity_body(
    fragments: &mut Fragments,
    head: Vec<u8>,
    tail: &'static [u8],
    sep: &[u8],
    format: Format,
) -> Pieces {
    let n = fragments.map.len();
    let mut parts = Vec::with_capacity(n + 2);
    parts.push(Bytes::from(head));
    for (i, f) in fragments.map.values_mut().enumerate() {
        let text = match &f.text {
            Some(t) => t.clone(),
            None => {
                let t = f.text_or_inflate(format);
                f.text = Some(t.clone());
                t
            }
        };
        if i + 1 == n {
            parts.push(text.slice(..text.len() - sep.len()));
        } else {
            parts.push(text);
        }
    }
    parts.push(Bytes::from_static(tail));
    Pieces::new(parts)
}

/// The bytes that turn a piece's closing empty stored block (`00 00 ff ff`) into one holding
/// `sep`: its length, the length's complement, and `sep`.
fn separator_block(sep: &[u8]) -> Vec<u8> {
    if sep.is_empty() {
        return gzip::SYNC_TAIL.to_vec();
    }
    let len = sep.len() as u16;
    let mut b = Vec::with_capacity(4 + sep.len());
    b.extend_from_slice(&len.to_le_bytes());
    b.extend_from_slice(&(!len).to_le_bytes());
    b.extend_from_slice(sep);
    b
}

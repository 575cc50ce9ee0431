//! Byte assembly: a payload's gzip form as the fragments' deflate pieces joined into one
//! member with a combined CRC-32, and its identity form as the fragments' shared bytes.

use super::*;

/// The gzip form of a payload: a header, the head as a stored block, each fragment's deflated
/// piece (with the separator in its closing block), the tail, and a trailer whose CRC-32 is
/// combined from the pieces' own. Also the time the oldest fragment was encoded.
pub(super) fn gzip_body(fragments: &Fragments, head: &[u8], tail: &[u8], sep: &[u8]) -> (Vec<u8>, Instant) {
    let sep_block = separator_block(sep);
    let head_piece = gzip::stored(head);
    let tail_piece = gzip::stored(tail);
    let n = fragments.map.len();
    let mut sum = Sum::of(head);
    let mut oldest = Instant::now();
    let mut size = gzip::HEADER.len() + head_piece.len() + tail_piece.len() + 10;
    for (i, f) in fragments.map.values().enumerate() {
        let last = i + 1 == n;
        sum = sum.then(if last { f.plain } else { f.separated });
        size += f.deflated.len() + sep_block.len();
        oldest = oldest.min(f.taken);
    }
    sum = sum.then(Sum::of(tail));

    let mut gz = Vec::with_capacity(size);
    gz.extend_from_slice(&gzip::HEADER);
    gz.extend_from_slice(&head_piece);
    for (i, f) in fragments.map.values().enumerate() {
        let last = i + 1 == n;
        if last || sep.is_empty() {
            gz.extend_from_slice(&f.deflated);
        } else {
            // The piece's closing empty stored block becomes one holding the separator.
            gz.extend_from_slice(&f.deflated[..f.deflated.len() - gzip::SYNC_TAIL.len()]);
            gz.extend_from_slice(&sep_block);
        }
    }
    gz.extend_from_slice(&tail_piece);
    gz.extend_from_slice(&gzip::trailer(sum));
    (gz, oldest)
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

//! A gzip member joined from independently compressed pieces, so that a payload made of cached
//! parts is compressed part by part and a change recompresses only the part that changed.
//!
//! Each piece is a raw deflate stream ended by a sync flush, so it ends on a byte boundary with
//! non-final blocks; any sequence of such pieces is one valid deflate stream. A piece is either
//! independent (no back-references outside it) or compressed *after* a few bytes that precede it
//! in the document ([`deflate_after`]): it may then refer back into them, which a decoder has in
//! its window when the piece follows them, so that a document split into pieces compresses about
//! as well as the whole. The member is the gzip header, the pieces, an empty final block, and the
//! CRC-32 and length of the whole, the CRC combined from the pieces' own (RFC 1952), so every gzip
//! reader sees one ordinary member.
//!
//! flate2 runs on zlib-rs (a Rust port of zlib, `zlib-rs` feature): about twice as fast as its
//! default miniz_oxide backend for the same bytes (a 19 KB application fragment: 123 µs at level
//! 8 with a preset dictionary, against 230-255 µs at miniz_oxide's level 6, 2026-12-03), and it
//! takes a preset dictionary for raw deflate, which [`deflate_after`] uses.

use bytes::Bytes;

/// The gzip header: no name, no time, operating system unknown.
pub const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

/// An empty final fixed-Huffman block: BFINAL=1, BTYPE=01, then the end-of-block code.
const FINAL_BLOCK: [u8; 2] = [0x03, 0x00];

/// What a sync flush ends with: an empty stored block's LEN and NLEN.
pub const SYNC_TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// The reflected CRC-32 polynomial.
const POLY: u32 = 0xedb8_8320;

/// `a·b mod p(x)` on reflected CRC-32 polynomials.
fn multiply(a: u32, mut b: u32) -> u32 {
    let mut product = 0u32;
    let mut bit = 0x8000_0000u32;
    while bit != 0 {
        if a & bit != 0 {
            product ^= b;
        }
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        bit >>= 1;
    }
    product
}

/// `x^(8·len) mod p(x)`: multiplying a CRC by it appends `len` zero bytes to what it covers.
pub fn shift_for(len: u64) -> u32 {
    let mut result = 0x8000_0000u32; // x^0
    let mut square = 0x0080_0000u32; // x^8
    let mut n = len;
    while n != 0 {
        if n & 1 != 0 {
            result = multiply(square, result);
        }
        square = multiply(square, square);
        n >>= 1;
    }
    result
}

/// The CRC-32 and length of some bytes, and the shift for that length, so that appending them
/// to a running CRC costs one multiplication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sum {
    pub crc: u32,
    pub len: u64,
    shift: u32,
}

impl Sum {
    pub fn of(data: &[u8]) -> Sum {
        Sum::new(crc32fast::hash(data), data.len() as u64)
    }

    pub fn new(crc: u32, len: u64) -> Sum {
        Sum {
            crc,
            len,
            shift: shift_for(len),
        }
    }

    /// The sum of nothing.
    pub const EMPTY: Sum = Sum {
        crc: 0,
        len: 0,
        shift: 0x8000_0000,
    };

    /// The sum of `self`'s bytes followed by `next`'s.
    pub fn then(self, next: Sum) -> Sum {
        Sum {
            crc: multiply(next.shift, self.crc) ^ next.crc,
            len: self.len + next.len,
            shift: multiply(next.shift, self.shift),
        }
    }
}

/// `data` as a raw deflate piece: its own stream, ended by a sync flush (so on a byte boundary,
/// with no final block).
pub fn deflate(data: &[u8], level: u32) -> Vec<u8> {
    deflate_after(&[], data, level)
}

/// `data` as a raw deflate piece that may refer back into `dict`: valid wherever it follows a
/// stream whose output ends with `dict` (at most 32 KiB are used), ended by a sync flush.
pub fn deflate_after(dict: &[u8], data: &[u8], level: u32) -> Vec<u8> {
    let mut compress = flate2::Compress::new(flate2::Compression::new(level), false);
    let dict = &dict[dict.len().saturating_sub(32 * 1024)..];
    if !dict.is_empty() && compress.set_dictionary(dict).is_err() {
        return stored(data);
    }
    let mut out = Vec::with_capacity(data.len() / 8 + 64);
    if !flush(&mut compress, data, &mut out) {
        return stored(data);
    }
    out
}

/// Compresses all of `data` into `out` and sync-flushes; false if the compressor refused.
fn flush(compress: &mut flate2::Compress, data: &[u8], out: &mut Vec<u8>) -> bool {
    let start = compress.total_in();
    loop {
        if out.capacity() - out.len() < 64 {
            out.reserve(out.capacity().max(1024));
        }
        let consumed = usize::try_from(compress.total_in() - start)
            .unwrap_or(usize::MAX)
            .min(data.len());
        if compress
            .compress_vec(&data[consumed..], out, flate2::FlushCompress::Sync)
            .is_err()
        {
            // Not expected with room to write; the caller then stays correct with stored blocks.
            return false;
        }
        // A sync flush is complete once a call leaves room in the output.
        if consumed >= data.len() && out.len() < out.capacity() {
            break;
        }
    }
    compress.total_in() - start == data.len() as u64 && out.ends_with(&SYNC_TAIL)
}

/// `data` in stored (uncompressed) blocks, ended like a sync flush.
pub fn stored(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + data.len() / 65_535 * 5 + 10);
    for chunk in data.chunks(65_535) {
        let len = chunk.len() as u16;
        out.push(0);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(chunk);
    }
    out.push(0);
    out.extend_from_slice(&SYNC_TAIL);
    out
}

/// The end of a member: the final block, the CRC-32 and the length modulo 2^32.
pub fn trailer(sum: Sum) -> [u8; 10] {
    let mut t = [0u8; 10];
    t[..2].copy_from_slice(&FINAL_BLOCK);
    t[2..6].copy_from_slice(&sum.crc.to_le_bytes());
    t[6..].copy_from_slice(&(sum.len as u32).to_le_bytes());
    t
}

/// A raw deflate stream of pieces, as one contiguous gzip member.
pub fn member(pieces: &[&[u8]], sum: Sum) -> Bytes {
    let size = HEADER.len() + pieces.iter().map(|p| p.len()).sum::<usize>() + 10;
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&HEADER);
    for p in pieces {
        out.extend_from_slice(p);
    }
    out.extend_from_slice(&trailer(sum));
    Bytes::from(out)
}

/// Inflates a piece compressed after `dict` ([`deflate_after`]).
pub fn inflate_after(dict: &[u8], piece: &[u8]) -> std::io::Result<Vec<u8>> {
    if dict.is_empty() {
        return inflate(piece);
    }
    let mut stream = stored(dict);
    stream.extend_from_slice(piece);
    let mut out = inflate(&stream)?;
    out.drain(..dict.len().min(out.len()));
    Ok(out)
}

/// Inflates the pieces of one raw deflate stream that has no final block yet.
pub fn inflate(piece: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut data = Vec::with_capacity(piece.len() + 2);
    data.extend_from_slice(piece);
    data.extend_from_slice(&FINAL_BLOCK);
    let mut out = Vec::with_capacity(piece.len() * 8);
    std::io::Read::read_to_end(&mut flate2::read::DeflateDecoder::new(&data[..]), &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gunzip(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(data), &mut out).expect("valid gzip");
        out
    }

    #[test]
    fn sums_combine_like_the_crc_of_the_joined_bytes() {
        let parts: [&[u8]; 4] = [b"", b"{\"applications\":", b"x", &[7u8; 70_000]];
        let mut sum = Sum::EMPTY;
        let mut joined = Vec::new();
        for p in parts {
            sum = sum.then(Sum::of(p));
            joined.extend_from_slice(p);
            assert_eq!(sum, Sum::of(&joined));
        }
        // Associative: (a+b)+c = a+(b+c).
        let (a, b, c) = (Sum::of(b"abc"), Sum::of(b"defgh"), Sum::of(&[1u8; 300]));
        assert_eq!(a.then(b).then(c), a.then(b.then(c)));
    }

    #[test]
    fn independently_deflated_pieces_make_one_gzip_member() {
        let parts: Vec<Vec<u8>> = (0..50)
            .map(|i| format!("{{\"name\":\"APP-{i}\",\"x\":\"{}\"}},", "y".repeat(i * 37)).into_bytes())
            .collect();
        let pieces: Vec<Vec<u8>> = parts
            .iter()
            .enumerate()
            .map(|(i, p)| if i % 7 == 3 { stored(p) } else { deflate(p, 6) })
            .collect();
        for p in &pieces {
            assert!(p.ends_with(&SYNC_TAIL), "a sync flush ends each piece");
            assert_eq!(inflate(p).unwrap(), p_raw(&parts, &pieces, p));
        }
        let sum = parts.iter().fold(Sum::EMPTY, |s, p| s.then(Sum::of(p)));
        let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        let gz = member(&refs, sum);
        assert_eq!(gunzip(&gz), parts.concat());
        // An empty member is valid too.
        assert!(gunzip(&member(&[], Sum::EMPTY)).is_empty());
    }

    #[test]
    fn pieces_compressed_after_their_predecessors_tail_make_one_smaller_member() {
        let parts: Vec<Vec<u8>> = (0..40)
            .map(|i| {
                format!("{{\"name\":\"APP-{i:03}\",\"instance\":[{{\"hostName\":\"10.0.0.{i}\",\"status\":\"UP\",\"dataCenterInfo\":{{\"name\":\"MyOwn\"}}}}]}},")
                    .into_bytes()
            })
            .collect();
        let mut pieces = Vec::new();
        let mut prev: &[u8] = &[];
        for p in &parts {
            let dict = &prev[prev.len().saturating_sub(64)..];
            let piece = deflate_after(dict, p, 6);
            assert!(piece.ends_with(&SYNC_TAIL));
            assert_eq!(
                inflate_after(dict, &piece).unwrap(),
                *p,
                "each piece inflates after its dictionary"
            );
            pieces.push(piece);
            prev = p;
        }
        let sum = parts.iter().fold(Sum::EMPTY, |s, p| s.then(Sum::of(p)));
        let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        assert_eq!(gunzip(&member(&refs, sum)), parts.concat());
        let alone: usize = parts.iter().map(|p| deflate(p, 6).len()).sum();
        let after: usize = pieces.iter().map(Vec::len).sum();
        assert!(after * 10 < alone * 7, "{after} bytes after the tails, {alone} alone");
    }

    fn p_raw<'a>(parts: &'a [Vec<u8>], pieces: &[Vec<u8>], p: &[u8]) -> &'a [u8] {
        let i = pieces.iter().position(|q| q == p).unwrap();
        &parts[i]
    }
}

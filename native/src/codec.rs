//! The gRPC-over-HTTP/2 wire details that are not HTTP/2 itself: message framing,
//! `grpc-timeout`, `grpc-message` percent-encoding and `-bin` metadata.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_NO_PAD, STANDARD_NO_PAD_INDIFFERENT};
use bytes::{Buf, Bytes, BytesMut};

/// The length prefix of every gRPC message: a compressed flag and a big-endian u32.
pub const PREFIX_LEN: usize = 5;

/// Why a request stream is refused in Rust before its message reaches Python.
#[derive(Debug, PartialEq, Eq)]
pub enum Reject {
    /// The declared length (the message itself is never read).
    TooLarge(u32),
    Compressed,
}

/// Reassembles length-prefixed messages from DATA chunks, whatever the frame boundaries.
pub struct Decoder {
    buf: BytesMut,
    max: usize,
}

impl Decoder {
    pub fn new(max: usize) -> Self {
        Decoder {
            buf: BytesMut::new(),
            max,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// Whether a partial message is buffered (an error if the request ends here).
    pub fn has_partial(&self) -> bool {
        !self.buf.is_empty()
    }

    /// The next complete message, if buffered. A prefix is judged as soon as its five bytes
    /// are in, so an oversized message is refused before any of it is buffered.
    pub fn next_message(&mut self) -> Option<Result<Bytes, Reject>> {
        if self.buf.len() < PREFIX_LEN {
            return None;
        }
        let declared = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
        if self.buf[0] != 0 {
            return Some(Err(Reject::Compressed));
        }
        if declared as usize > self.max {
            return Some(Err(Reject::TooLarge(declared)));
        }
        let total = PREFIX_LEN + declared as usize;
        if self.buf.len() < total {
            // One allocation for the rest of a large message rather than repeated doubling.
            self.buf.reserve(total - self.buf.len());
            return None;
        }
        self.buf.advance(PREFIX_LEN);
        Some(Ok(self.buf.split_to(declared as usize).freeze()))
    }
}

/// Appends `message` to `out` behind its 5-byte prefix (uncompressed).
pub fn frame_into(out: &mut BytesMut, message: &[u8]) {
    out.reserve(PREFIX_LEN + message.len());
    out.extend_from_slice(&[0]);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
}

/// `grpc-timeout` as seconds: at most 8 ASCII digits and one unit of H M S m u n.
pub fn parse_timeout(value: &[u8]) -> Option<f64> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: f64 = std::str::from_utf8(digits).ok()?.parse::<u64>().ok()? as f64;
    let scale = match unit {
        b'H' => 3600.0,
        b'M' => 60.0,
        b'S' => 1.0,
        b'm' => 1e-3,
        b'u' => 1e-6,
        b'n' => 1e-9,
        _ => return None,
    };
    Some(n * scale)
}

/// `grpc-message` encoding: UTF-8 bytes outside printable ASCII, and '%', as %XX.
pub fn percent_encode(message: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 0xf) as usize] as char);
        }
    }
    out
}

/// `-bin` values are sent unpadded, as gRPC implementations emit them.
pub fn encode_bin(value: &[u8]) -> String {
    STANDARD_NO_PAD.encode(value)
}

/// `-bin` values are accepted padded or not: the spec allows both.
pub fn decode_bin(value: &[u8]) -> Option<Vec<u8>> {
    STANDARD_NO_PAD_INDIFFERENT.decode(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(messages: &[&[u8]]) -> Vec<u8> {
        let mut out = BytesMut::new();
        for m in messages {
            frame_into(&mut out, m);
        }
        out.to_vec()
    }

    #[test]
    fn reassembles_across_every_split() {
        let wire = framed(&[b"hello", b"", b"world!!"]);
        for a in 0..=wire.len() {
            for b in a..=wire.len() {
                let mut d = Decoder::new(100);
                let mut got = Vec::new();
                for chunk in [&wire[..a], &wire[a..b], &wire[b..]] {
                    d.push(chunk);
                    while let Some(m) = d.next_message() {
                        got.push(m.unwrap());
                    }
                }
                assert_eq!(got, vec![&b"hello"[..], b"", b"world!!"], "split {a} {b}");
                assert!(!d.has_partial());
            }
        }
    }

    #[test]
    fn partial_is_reported() {
        let wire = framed(&[b"abc"]);
        let mut d = Decoder::new(100);
        d.push(&wire[..6]);
        assert!(d.next_message().is_none());
        assert!(d.has_partial());
    }

    #[test]
    fn oversized_refused_on_prefix_alone() {
        let mut d = Decoder::new(4);
        d.push(&[0, 0, 0, 0, 5]);
        assert_eq!(d.next_message(), Some(Err(Reject::TooLarge(5))));
        let mut d = Decoder::new(5);
        d.push(&[0, 0, 0, 0, 5, 1, 2, 3, 4, 5]);
        assert_eq!(
            d.next_message(),
            Some(Ok(Bytes::from_static(&[1, 2, 3, 4, 5])))
        );
    }

    #[test]
    fn compressed_refused() {
        let mut d = Decoder::new(100);
        d.push(&[1, 0, 0, 0, 1, 9]);
        assert_eq!(d.next_message(), Some(Err(Reject::Compressed)));
    }

    #[test]
    fn timeouts() {
        assert_eq!(parse_timeout(b"1S"), Some(1.0));
        assert_eq!(parse_timeout(b"2H"), Some(7200.0));
        assert_eq!(parse_timeout(b"3M"), Some(180.0));
        assert_eq!(parse_timeout(b"250m"), Some(0.25));
        assert_eq!(parse_timeout(b"99999999u"), Some(99.999999));
        assert_eq!(parse_timeout(b"5000000n"), Some(0.005));
        assert_eq!(parse_timeout(b"123456789S"), None);
        assert_eq!(parse_timeout(b"S"), None);
        assert_eq!(parse_timeout(b""), None);
        assert_eq!(parse_timeout(b"1x"), None);
        assert_eq!(parse_timeout(b"-1S"), None);
        assert_eq!(parse_timeout(b"1 S"), None);
    }

    #[test]
    fn percent_encoding() {
        assert_eq!(percent_encode("plain text"), "plain text");
        assert_eq!(percent_encode("100%"), "100%25");
        assert_eq!(percent_encode("ü"), "%C3%BC");
        assert_eq!(percent_encode("a\nb"), "a%0Ab");
        assert_eq!(percent_encode("~\x7f"), "~%7F");
    }

    #[test]
    fn base64_bin() {
        assert_eq!(encode_bin(b"\x00\x01"), "AAE");
        assert_eq!(decode_bin(b"AAE").unwrap(), b"\x00\x01");
        assert_eq!(decode_bin(b"AAE=").unwrap(), b"\x00\x01");
        assert_eq!(decode_bin(b"").unwrap(), b"");
        assert!(decode_bin(b"A").is_none());
        assert!(decode_bin(b"*&").is_none());
    }
}

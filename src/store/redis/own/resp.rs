//! Reading RESP2 replies (the protocol a connection speaks until it says `HELLO 3`):
//! simple strings, errors, integers, bulk strings and arrays, into the redis crate's
//! [`Value`], so that every command built with the crate reads its reply as before.
//!
//! A reply that is not all in the buffer yet is reported as incomplete, with the length
//! the buffer must reach before it is worth reading again when that is known (a long bulk
//! string arrives over many reads; it is read once, not once per read). Everything is
//! bounded: a bulk string's length, an array's length and how deeply arrays nest.

use redis::Value;

/// The longest bulk string read (Redis's own `proto-max-bulk-len` default).
const BULK_MAX: usize = 512 * 1024 * 1024;
/// The most elements in one array (a reply the gateway asks for has a handful).
const ARRAY_MAX: usize = 1 << 20;
/// How deeply arrays may nest (the gateway's deepest reply: a `MULTI`'s `TIME` in `EXEC`).
const DEPTH_MAX: usize = 8;

/// What the buffer holds.
#[derive(Debug)]
pub(super) enum Parsed {
    /// A reply and the bytes it took.
    Reply(Value, usize),
    /// Not all of it yet; at least this many bytes are needed when known (else 0).
    Incomplete(usize),
}

/// The reply cannot be read: the connection is out of step and must go.
#[derive(Debug, thiserror::Error)]
#[error("unreadable Redis reply: {0}")]
pub(super) struct Unreadable(pub(super) &'static str);

/// Reads the first reply in `buf`.
pub(super) fn parse(buf: &[u8]) -> Result<Parsed, Unreadable> {
    read(buf, true)
}

/// Reads past the first reply in `buf` (checked as [`parse`] checks it), building it only
/// if it is an error: any other reply is [`Value::Nil`]. For replies passed over (a
/// transaction's `OK` and `QUEUED`s), which need no allocation.
pub(super) fn pass(buf: &[u8]) -> Result<Parsed, Unreadable> {
    read(buf, false)
}

fn read(buf: &[u8], keep: bool) -> Result<Parsed, Unreadable> {
    let mut at = 0;
    match value(buf, &mut at, 0, keep)? {
        Some(v) => Ok(Parsed::Reply(v, at)),
        None => Ok(Parsed::Incomplete(at)),
    }
}

/// The line starting at `*at` (without its CRLF), moving `*at` past it; `None` while
/// its end has not arrived.
fn line<'a>(buf: &'a [u8], at: &mut usize) -> Result<Option<&'a [u8]>, Unreadable> {
    let rest = &buf[*at..];
    let Some(end) = memchr::memchr(b'\r', rest) else {
        return Ok(None);
    };
    match rest.get(end + 1) {
        None => Ok(None),
        Some(b'\n') => {
            *at += end + 2;
            Ok(Some(&rest[..end]))
        }
        Some(_) => Err(Unreadable("a line not ended by CRLF")),
    }
}

fn integer(digits: &[u8]) -> Result<i64, Unreadable> {
    let (sign, digits) = match digits {
        [b'-', rest @ ..] => (-1, rest),
        _ => (1, digits),
    };
    if digits.is_empty() || digits.len() > 19 {
        return Err(Unreadable("a malformed integer"));
    }
    // Accumulated with its sign, so that i64::MIN reads too.
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(Unreadable("a malformed integer"));
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(sign * i64::from(d - b'0')))
            .ok_or(Unreadable("an integer out of range"))?;
    }
    Ok(n)
}

/// A length: -1 (null) is `None`.
fn length(digits: &[u8], max: usize) -> Result<Option<usize>, Unreadable> {
    match integer(digits)? {
        -1 => Ok(None),
        n if n < 0 => Err(Unreadable("a negative length")),
        n if n as u64 > max as u64 => Err(Unreadable("a length over the bound")),
        n => Ok(Some(n as usize)),
    }
}

/// One value at `*at`. On `Ok(None)` (incomplete) `*at` holds the length the buffer must
/// reach, when known, else 0.
/// Only errors are built unless `keep`.
fn value(
    buf: &[u8],
    at: &mut usize,
    depth: usize,
    keep: bool,
) -> Result<Option<Value>, Unreadable> {
    let start = *at;
    let Some(&kind) = buf.get(start) else {
        *at = 0;
        return Ok(None);
    };
    *at += 1;
    let Some(text) = line(buf, at)? else {
        *at = 0;
        return Ok(None);
    };
    let v = match kind {
        b'+' if !keep => Value::Nil,
        b'+' if text == b"OK" => Value::Okay,
        b'+' => Value::SimpleString(utf8(text)?),
        b'-' => error(&buf[start..*at])?,
        b':' => Value::Int(integer(text)?),
        b'$' => match length(text, BULK_MAX)? {
            None => Value::Nil,
            Some(n) => {
                let end = *at + n;
                if buf.len() < end + 2 {
                    *at = end + 2;
                    return Ok(None);
                }
                if &buf[end..end + 2] != b"\r\n" {
                    return Err(Unreadable("a bulk string not ended by CRLF"));
                }
                let v = if keep {
                    Value::BulkString(buf[*at..end].to_vec())
                } else {
                    Value::Nil
                };
                *at = end + 2;
                v
            }
        },
        b'*' => match length(text, ARRAY_MAX)? {
            None => Value::Nil,
            Some(n) if n > 0 && depth >= DEPTH_MAX => {
                return Err(Unreadable("arrays nested too deep"))
            }
            Some(n) => {
                // Never more room reserved than the elements that have arrived could fill.
                let mut items = Vec::with_capacity(if keep { n.min(buf.len() - *at) } else { 0 });
                for _ in 0..n {
                    match value(buf, at, depth + 1, keep)? {
                        Some(item) if keep => items.push(item),
                        Some(_) => {}
                        // `*at` holds what the element needs: a bound for the whole too.
                        None => return Ok(None),
                    }
                }
                if keep {
                    Value::Array(items)
                } else {
                    Value::Nil
                }
            }
        },
        _ => return Err(Unreadable("an unknown reply type")),
    };
    Ok(Some(v))
}

fn utf8(text: &[u8]) -> Result<String, Unreadable> {
    String::from_utf8(text.to_vec()).map_err(|_| Unreadable("a simple string not in UTF-8"))
}

/// An error reply (`-CODE message`), as the redis crate reads it: its code is what the
/// store looks at (`NOSCRIPT`, `READONLY`, `ERR`).
fn error(whole: &[u8]) -> Result<Value, Unreadable> {
    match redis::parse_redis_value(whole) {
        Ok(v @ Value::ServerError(_)) => Ok(v),
        _ => Err(Unreadable("a malformed error reply")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(bytes: &[u8]) -> Value {
        match parse(bytes).unwrap() {
            Parsed::Reply(v, used) => {
                assert_eq!(used, bytes.len(), "{bytes:?}");
                v
            }
            Parsed::Incomplete(_) => panic!("incomplete: {bytes:?}"),
        }
    }

    #[test]
    fn reads_what_the_crate_reads() {
        let samples: &[&[u8]] = &[
            b"+OK\r\n",
            b"+QUEUED\r\n",
            b":0\r\n",
            b":-42\r\n",
            b":9223372036854775807\r\n",
            b":-9223372036854775808\r\n",
            b"$-1\r\n",
            b"$0\r\n\r\n",
            b"$5\r\nab\r\nc\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*3\r\n$3\r\nabc\r\n:1723456789012\r\n*2\r\n:1\r\n:2\r\n",
            b"*2\r\n$-1\r\n:-2\r\n",
            b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
            b"-READONLY You can't write against a read only replica.\r\n",
            b"-ERR syntax error\r\n",
        ];
        for s in samples {
            let ours = whole(s);
            let theirs = redis::parse_redis_value(s).unwrap();
            assert_eq!(format!("{ours:?}"), format!("{theirs:?}"), "{s:?}");
        }
    }

    #[test]
    fn every_prefix_is_incomplete_and_never_misread() {
        let s: &[u8] = b"*3\r\n$3\r\nabc\r\n+OK\r\n*2\r\n:1\r\n$2\r\nxy\r\n";
        for cut in 0..s.len() {
            match parse(&s[..cut]).unwrap() {
                Parsed::Incomplete(need) => assert!(need <= s.len(), "{cut}: {need}"),
                Parsed::Reply(v, _) => panic!("{cut}: read {v:?} from a prefix"),
            }
        }
        whole(s);
    }

    #[test]
    fn a_long_bulk_string_says_how_much_it_needs() {
        let mut s = b"$100000\r\n".to_vec();
        s.extend(std::iter::repeat_n(b'x', 10));
        match parse(&s).unwrap() {
            Parsed::Incomplete(need) => assert_eq!(need, 9 + 100_000 + 2),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn passing_over_reads_as_far_and_keeps_only_errors() {
        let samples: &[&[u8]] = &[
            b"+QUEUED\r\n",
            b"$5\r\nab\r\nc\r\n",
            b"*3\r\n$3\r\nabc\r\n:1\r\n*2\r\n:1\r\n:2\r\n",
            b"-ERR syntax error\r\n",
        ];
        for s in samples {
            let Parsed::Reply(v, used) = pass(s).unwrap() else {
                panic!("{s:?}")
            };
            assert_eq!(used, s.len(), "{s:?}");
            if s[0] == b'-' {
                assert!(matches!(v, Value::ServerError(_)), "{v:?}");
            } else {
                assert_eq!(v, Value::Nil, "{s:?}");
            }
            assert!(matches!(
                pass(&s[..s.len() - 1]).unwrap(),
                Parsed::Incomplete(_)
            ));
        }
        assert!(pass(b"*1\r\n?\r\n").is_err());
    }

    #[test]
    fn two_replies_are_read_one_at_a_time() {
        let s = b"+OK\r\n:7\r\n";
        let Parsed::Reply(Value::Okay, used) = parse(s).unwrap() else {
            panic!()
        };
        assert!(matches!(
            parse(&s[used..]).unwrap(),
            Parsed::Reply(Value::Int(7), 4)
        ));
    }

    #[test]
    fn refuses_what_is_out_of_step_or_out_of_bounds() {
        let bad: &[&[u8]] = &[
            b"?what\r\n",
            b"+OK\rX",
            b":12a\r\n",
            b":\r\n",
            b":99999999999999999999\r\n",
            b":9223372036854775808\r\n",
            b"$-2\r\n",
            b"$3\r\nabcXY",
            b"$536870913\r\n",
            b"*1048577\r\n",
            b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
        ];
        for s in bad {
            assert!(parse(s).is_err(), "{s:?}");
        }
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let alphabet = b"+-:$*\r\n0123456789-abc";
        for _ in 0..20_000 {
            let len = (x % 40) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    alphabet[(x % alphabet.len() as u64) as usize]
                })
                .collect();
            let _ = parse(&bytes);
        }
    }
}

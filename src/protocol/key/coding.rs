//! Content codings of request bodies (RFC 9110 §8.4), undone before a body is keyed: the
//! same content compressed twice (a gzip header carries a time) is the same request, and a
//! `json:` part reads the JSON, not its compressed bytes. The upstream still gets the bytes
//! the client sent. Pure, and bounded: at most [`MAX_CODINGS`] codings, and the bytes
//! decoded by every layer together may not exceed the limit the raw body has
//! (`server.max_body`), so a decompression bomb is a 413, not a heap, and a body coded
//! twenty thousand times over (each layer decoding the whole body again) is a 415, not
//! half a minute of a core.

use std::borrow::Cow;
use std::io::Read;

use http::header::CONTENT_ENCODING;
use http::HeaderMap;

/// The most codings a body may name: every real client applies one, a few two; each more
/// is a pass over the whole body that no client needs.
pub const MAX_CODINGS: usize = 2;

/// Why a body's coding could not be undone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodingError {
    /// A coding the gateway does not decode (415).
    #[error("the content coding {0:?} is not supported here (gzip, deflate, br, zstd)")]
    Unsupported(String),
    /// More codings than [`MAX_CODINGS`] (415).
    #[error("the request names {sent} content codings; at most {MAX_CODINGS} are decoded here")]
    TooMany {
        /// How many the request named (counted up to a bound).
        sent: usize,
    },
    /// The bytes decoded, over every layer together, exceed `server.max_body` (413).
    #[error("the decoded request body exceeds {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// The body is not valid in the coding it names (400).
    #[error("the request body is not valid {coding}")]
    Corrupt {
        /// The coding.
        coding: &'static str,
    },
}

/// The codings a body may carry, as named in `Content-Encoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Coding {
    Gzip,
    Deflate,
    Brotli,
    Zstd,
}

impl Coding {
    fn parse(name: &str) -> Result<Option<Self>, CodingError> {
        Ok(Some(match name.to_ascii_lowercase().as_str() {
            "identity" | "" => return Ok(None),
            "gzip" | "x-gzip" => Self::Gzip,
            "deflate" => Self::Deflate,
            "br" => Self::Brotli,
            "zstd" => Self::Zstd,
            _ => return Err(CodingError::Unsupported(name.chars().take(64).collect())),
        }))
    }

    fn name(self) -> &'static str {
        match self {
            Self::Gzip => "gzip",
            Self::Deflate => "deflate",
            Self::Brotli => "br",
            Self::Zstd => "zstd",
        }
    }

    /// `body` decoded, at most `limit` bytes of it.
    fn decode(self, body: &[u8], limit: u64) -> Result<Vec<u8>, CodingError> {
        let corrupt = CodingError::Corrupt {
            coding: self.name(),
        };
        match self {
            Self::Gzip => bounded(flate2::read::MultiGzDecoder::new(body), limit, corrupt),
            // RFC 9110's "deflate" is the zlib format; some clients send raw deflate.
            Self::Deflate => bounded(flate2::read::ZlibDecoder::new(body), limit, corrupt.clone())
                .or_else(|e| match e {
                    CodingError::Corrupt { .. } => {
                        bounded(flate2::read::DeflateDecoder::new(body), limit, corrupt)
                    }
                    other => Err(other),
                }),
            Self::Brotli => bounded(
                brotli_decompressor::Decompressor::new(body, 4096),
                limit,
                corrupt,
            ),
            Self::Zstd => {
                let decoder =
                    ruzstd::decoding::StreamingDecoder::new(body).map_err(|_| corrupt.clone())?;
                bounded(decoder, limit, corrupt)
            }
        }
    }
}

/// Reads `reader` to its end, refusing more than `limit` bytes.
fn bounded(reader: impl Read, limit: u64, corrupt: CodingError) -> Result<Vec<u8>, CodingError> {
    let mut out = Vec::new();
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|_| corrupt)?;
    if out.len() as u64 > limit {
        return Err(CodingError::TooLarge { limit });
    }
    Ok(out)
}

/// The body with every coding `Content-Encoding` names undone (the last applied first);
/// the body itself when it names none.
pub fn decoded<'a>(
    headers: &HeaderMap,
    body: &'a [u8],
    limit: u64,
) -> Result<Cow<'a, [u8]>, CodingError> {
    decoded_by(&CONTENT_ENCODING, headers, body, limit)
}

/// The body with every coding the `header` names undone: `Content-Encoding`, or gRPC's
/// `grpc-encoding` for a compressed message (gzip, deflate, zstd, as gRPC names them).
/// The bytes every layer decodes count against one budget of `limit`.
pub fn decoded_by<'a>(
    header: &http::HeaderName,
    headers: &HeaderMap,
    body: &'a [u8],
    limit: u64,
) -> Result<Cow<'a, [u8]>, CodingError> {
    let codings = codings(header, headers)?;
    let mut budget = limit;
    let mut body = Cow::Borrowed(body);
    for coding in codings.into_iter().rev() {
        let out = coding.decode(&body, budget).map_err(|e| match e {
            CodingError::TooLarge { .. } => CodingError::TooLarge { limit },
            other => other,
        })?;
        budget -= out.len() as u64;
        body = Cow::Owned(out);
    }
    Ok(body)
}

/// Whether `headers` name any coding under `header` other than `identity`: whether
/// [`decoded_by`] has work to do (the caller may then run it off the async threads).
pub fn is_coded(header: &http::HeaderName, headers: &HeaderMap) -> bool {
    !matches!(codings(header, headers), Ok(c) if c.is_empty())
}

/// The codings `header` names, in the order applied; refused past [`MAX_CODINGS`], with
/// how many were named (those past the bound counted, not parsed).
fn codings(header: &http::HeaderName, headers: &HeaderMap) -> Result<Vec<Coding>, CodingError> {
    let mut codings = Vec::new();
    let mut sent = 0;
    for value in headers.get_all(header) {
        let text = value.to_str().map_err(|_| {
            CodingError::Unsupported(String::from_utf8_lossy(value.as_bytes()).into())
        })?;
        for name in text.split(',').map(str::trim) {
            if sent >= MAX_CODINGS {
                sent += usize::from(!name.is_empty() && !name.eq_ignore_ascii_case("identity"));
            } else if let Some(c) = Coding::parse(name)? {
                sent += 1;
                codings.push(c);
            }
        }
    }
    if sent > MAX_CODINGS {
        return Err(CodingError::TooMany { sent });
    }
    Ok(codings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const JSON: &[u8] = br#"{"order_id":"o-1","amount":1200}"#;

    fn headers(encoding: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_ENCODING, encoding.parse().unwrap());
        h
    }

    fn gzip(data: &[u8], mtime: u32) -> Vec<u8> {
        let mut e = flate2::GzBuilder::new()
            .mtime(mtime)
            .write(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn every_coding_decodes_to_the_same_content() {
        let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        zlib.write_all(JSON).unwrap();
        let mut raw = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        raw.write_all(JSON).unwrap();
        let mut br = Vec::new();
        brotli::BrotliCompress(&mut &JSON[..], &mut br, &Default::default()).unwrap();
        let zstd =
            ruzstd::encoding::compress_to_vec(JSON, ruzstd::encoding::CompressionLevel::Fastest);
        for (name, bytes) in [
            ("gzip", gzip(JSON, 1)),
            ("x-gzip", gzip(JSON, 2)),
            ("deflate", zlib.finish().unwrap()),
            ("deflate", raw.finish().unwrap()),
            ("br", br),
            ("zstd", zstd),
            ("identity", JSON.to_vec()),
        ] {
            let got = decoded(&headers(name), &bytes, 1 << 20).unwrap();
            assert_eq!(&*got, JSON, "{name}");
        }
        // Two codings: the last applied is undone first.
        let twice = gzip(&gzip(JSON, 3), 4);
        assert_eq!(
            &*decoded(&headers("gzip, gzip"), &twice, 1 << 20).unwrap(),
            JSON
        );
    }

    #[test]
    fn a_bomb_is_too_large_and_garbage_is_corrupt() {
        let bomb = gzip(&vec![b'a'; 10 << 20], 0);
        assert!(bomb.len() < 64 << 10);
        assert_eq!(
            decoded(&headers("gzip"), &bomb, 1 << 20),
            Err(CodingError::TooLarge { limit: 1 << 20 })
        );
        assert_eq!(
            decoded(&headers("gzip"), b"not gzip", 1 << 20),
            Err(CodingError::Corrupt { coding: "gzip" })
        );
        assert_eq!(
            decoded(&headers("compress"), JSON, 1 << 20),
            Err(CodingError::Unsupported("compress".into()))
        );
        assert!(matches!(
            decoded(&HeaderMap::new(), JSON, 1),
            Ok(Cow::Borrowed(_))
        ));
    }
    #[test]
    fn more_than_two_codings_are_refused_with_their_count_before_any_is_decoded() {
        let twice = gzip(&gzip(JSON, 3), 4);
        assert_eq!(
            decoded(&headers("gzip, gzip, gzip"), &twice, 1 << 20),
            Err(CodingError::TooMany { sent: 3 })
        );
        // Twenty thousand layers: counted, not parsed, and nothing decoded.
        let many = vec!["br"; 20_000].join(", ");
        assert_eq!(
            decoded(&headers(&many), JSON, 1 << 20),
            Err(CodingError::TooMany { sent: 20_000 })
        );
        // Over several header lines, and whatever names they use past the bound.
        let mut h = headers("gzip");
        h.append(CONTENT_ENCODING, "gzip".parse().unwrap());
        h.append(CONTENT_ENCODING, "compress".parse().unwrap());
        assert_eq!(
            decoded(&h, &twice, 1 << 20),
            Err(CodingError::TooMany { sent: 3 })
        );
        // `identity` is no coding: it is not counted.
        assert_eq!(
            &*decoded(&headers("identity, gzip, identity, gzip"), &twice, 1 << 20).unwrap(),
            JSON
        );
        assert!(!is_coded(&CONTENT_ENCODING, &headers("identity")));
        assert!(is_coded(&CONTENT_ENCODING, &headers("gzip")));
        assert!(is_coded(&CONTENT_ENCODING, &headers(&many)));
        assert!(!is_coded(&CONTENT_ENCODING, &HeaderMap::new()));
    }

    #[test]
    fn the_bytes_every_layer_decodes_share_one_budget() {
        // The inner layer decodes to 600 KiB, the outer to about 600 KiB's gzip: each alone
        // is under the 1 MiB limit, together they are not.
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let noise: Vec<u8> = (0..600 << 10)
            .map(|_| {
                // xorshift: bytes gzip cannot shrink.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let inner = gzip(&noise, 0);
        let outer = gzip(&inner, 0);
        assert!(inner.len() < 1 << 20 && noise.len() < 1 << 20);
        assert!(inner.len() + noise.len() > 1 << 20);
        assert_eq!(
            decoded(&headers("gzip, gzip"), &outer, 1 << 20),
            Err(CodingError::TooLarge { limit: 1 << 20 })
        );
        let room = (inner.len() + noise.len()) as u64;
        assert_eq!(
            &*decoded(&headers("gzip, gzip"), &outer, room).unwrap(),
            &noise[..]
        );
    }

    /// Bounded property tests (issue 55's safety net; cargo-fuzz cannot run in CI here).
    mod properties {
        use super::*;
        use http::HeaderValue;
        use proptest::collection::vec;
        use proptest::prelude::*;
        use proptest::sample::select;

        fn config() -> ProptestConfig {
            ProptestConfig {
                cases: 256,
                failure_persistence: None,
                ..ProptestConfig::default()
            }
        }

        /// A `Content-Encoding` line: names real and not, in any case, with odd spacing,
        /// or any bytes a header value takes at all.
        fn line() -> impl Strategy<Value = HeaderValue> {
            let name = select(vec![
                "gzip", "x-gzip", "deflate", "br", "zstd", "identity", "", "GZip", "BR",
                "compress", "snappy", " gzip ", "gzip;q=1",
            ]);
            let listed = vec(name, 0..5).prop_map(|names| names.join(","));
            let any_bytes = vec(any::<u8>(), 0..16)
                .prop_filter_map("a header value", |b| HeaderValue::from_bytes(&b).ok());
            prop_oneof![
                3 => listed.prop_map(|l| HeaderValue::from_str(&l).unwrap()),
                1 => any_bytes,
            ]
        }

        /// How many codings other than `identity` the lines name, or `None` when a line is
        /// not text.
        fn named(lines: &[HeaderValue]) -> Option<usize> {
            let mut n = 0;
            for line in lines {
                let text = line.to_str().ok()?;
                n += text
                    .split(',')
                    .map(str::trim)
                    .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("identity"))
                    .count();
            }
            Some(n)
        }

        /// A body in one real coding, as a client writes it.
        fn encode(coding: Coding, data: &[u8]) -> Vec<u8> {
            match coding {
                Coding::Gzip => gzip(data, 7),
                Coding::Deflate => {
                    let mut z =
                        flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
                    z.write_all(data).unwrap();
                    z.finish().unwrap()
                }
                Coding::Brotli => {
                    let params = brotli::enc::BrotliEncoderParams {
                        quality: 4,
                        ..Default::default()
                    };
                    let mut out = Vec::new();
                    brotli::BrotliCompress(&mut &data[..], &mut out, &params).unwrap();
                    out
                }
                Coding::Zstd => ruzstd::encoding::compress_to_vec(
                    data,
                    ruzstd::encoding::CompressionLevel::Fastest,
                ),
            }
        }

        fn coding() -> impl Strategy<Value = Coding> {
            select(vec![
                Coding::Gzip,
                Coding::Deflate,
                Coding::Brotli,
                Coding::Zstd,
            ])
        }

        proptest! {
            #![proptest_config(config())]

            #[test]
            fn arbitrary_bodies_and_codings_never_panic_nor_pass_the_limit(
                lines in vec(line(), 0..3),
                body in vec(any::<u8>(), 0..512),
                limit in 0..4096u64,
                grpc in any::<bool>(),
            ) {
                let header = match grpc {
                    true => http::HeaderName::from_static("grpc-encoding"),
                    false => CONTENT_ENCODING,
                };
                let mut headers = HeaderMap::new();
                for line in &lines {
                    headers.append(&header, line.clone());
                }
                let got = decoded_by(&header, &headers, &body, limit);
                match (&got, named(&lines)) {
                    // Nothing to undo: the body itself, whatever its size.
                    (Ok(out), Some(0)) => prop_assert_eq!(&**out, &body[..]),
                    (Ok(out), Some(n)) => {
                        prop_assert!(n <= MAX_CODINGS, "{n} codings decoded");
                        prop_assert!(out.len() as u64 <= limit, "{} bytes past {limit}", out.len());
                    }
                    (Ok(_), None) => prop_assert!(false, "a line that is not text was read"),
                    (Err(CodingError::TooMany { sent }), n) => {
                        prop_assert_eq!(Some(*sent), n);
                        prop_assert!(*sent > MAX_CODINGS);
                    }
                    (Err(CodingError::TooLarge { limit: l }), _) => prop_assert_eq!(*l, limit),
                    (Err(_), _) => {}
                }
                if named(&lines).is_some_and(|n| n > MAX_CODINGS) {
                    prop_assert!(got.is_err(), "{} codings accepted", named(&lines).unwrap());
                }
                prop_assert_eq!(is_coded(&header, &headers), named(&lines) != Some(0));
            }

            #[test]
            fn a_body_in_one_or_two_real_codings_decodes_back_within_its_exact_budget(
                data in vec(any::<u8>(), 0..2048),
                codings in vec(coding(), 1..=2),
            ) {
                // Applied in order; the header lists them in that order.
                let mut layers = vec![data.clone()];
                for &c in &codings {
                    let next = encode(c, layers.last().unwrap());
                    layers.push(next);
                }
                let sent = layers.pop().unwrap();
                let names: Vec<_> = codings.iter().map(|c| c.name()).collect();
                let h = headers(&names.join(", "));
                // Every layer's output counts: the budget is exactly what they decode to.
                let budget: u64 = layers.iter().map(|l| l.len() as u64).sum();
                prop_assert_eq!(&*decoded(&h, &sent, budget).unwrap(), &data[..]);
                if budget > 0 {
                    prop_assert_eq!(
                        decoded(&h, &sent, budget - 1),
                        Err(CodingError::TooLarge { limit: budget - 1 })
                    );
                }
            }
        }
    }
}

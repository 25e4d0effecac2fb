use super::*;

fn sample(body: StoredBody) -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.append("x-multi", HeaderValue::from_static("1"));
    headers.append("x-multi", HeaderValue::from_static("2"));
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("3"));
    trailers.insert("grpc-message", HeaderValue::from_static("bad%20amount"));
    StoredResponse {
        status: StatusCode::CREATED,
        headers,
        body,
        expires: Some(UNIX_EPOCH + Duration::from_secs(1_900_000_000)),
        trailers,
    }
}

#[test]
fn fields_left_out_as_it_is_written_make_the_record_of_the_map_without_them() {
    let r = sample(StoredBody::Stored(Bytes::from_static(b"hi")));
    let k = StoreKey::from_raw("k");
    let fields = Fields {
        headers: map_fields(&r.headers).filter(|(n, _)| *n != b"x-multi"),
        size: 0,
        trailers: &r.trailers,
    };
    let written = encode(&k, r.status, fields, &r.body, r.expires);
    let mut without = r.clone();
    without.headers.remove("x-multi");
    assert_eq!(written, without.encode(&k));
    assert_eq!(StoredResponse::decode(&written, &k).unwrap(), without);
}

#[test]
fn a_field_a_header_map_refuses_makes_the_record_corrupt() {
    let k = StoreKey::from_raw("k");
    let mut r = sample(StoredBody::Stored(Bytes::from_static(b"hi")));
    r.trailers = HeaderMap::new();
    for (name, value) in [("x y", "1"), ("", "1"), ("x", "a\rb"), ("x", "a\u{7f}")] {
        let mut bad = r.clone();
        bad.headers = HeaderMap::new();
        let mut enc = BytesMut::new();
        put_fields(&mut enc, [(name.as_bytes(), value.as_bytes())].into_iter());
        let good = r.encode(&k);
        let fields_at = 4 + 2 + 1 + 8 + 2 + 1;
        let rest = {
            let (mut rd, _) = Reader::open(&good, &k).unwrap();
            rd.fields(0).unwrap();
            rd.pos
        };
        let mut record = good[..fields_at].to_vec();
        record.extend_from_slice(&enc);
        record.extend_from_slice(&good[rest..]);
        let record = Bytes::from(record);
        assert!(
            StoredResponse::decode(&record, &k).is_err(),
            "{name:?} {value:?}"
        );
    }
}

#[test]
fn a_response_without_trailers_is_written_as_version_2() {
    let mut r = sample(StoredBody::Stored(Bytes::from_static(b"hi")));
    r.trailers = HeaderMap::new();
    let k = StoreKey::from_raw("k");
    // DGR2, the layout a gateway of the release before trailers reads.
    let v2 = r.encode(&k);
    assert_eq!(&v2[..4], b"DGR2");
    assert_eq!(StoredResponse::decode(&v2, &k).unwrap(), r);
    // A DGR3 record with an empty trailer section still decodes.
    let mut v3 = v2.to_vec();
    v3[..4].copy_from_slice(b"DGR3");
    v3.extend_from_slice(&[0, 0]);
    assert_eq!(StoredResponse::decode(&Bytes::from(v3), &k).unwrap(), r);
    // Trailers with an empty body, as a gRPC error answer has: DGR3.
    let mut grpc = sample(StoredBody::Stored(Bytes::new()));
    grpc.headers = HeaderMap::new();
    let v3 = grpc.encode(&k);
    assert_eq!(&v3[..4], b"DGR3");
    assert_eq!(StoredResponse::decode(&v3, &k).unwrap(), grpc);
}

#[test]
fn round_trips_every_body_state() {
    for body in [
        StoredBody::Stored(Bytes::from_static(b"{\"id\":1}")),
        StoredBody::Stored(Bytes::new()),
        StoredBody::TooLarge,
        StoredBody::Incomplete,
        StoredBody::NotStored,
    ] {
        let r = sample(body);
        let enc = r.encode(&StoreKey::from_raw("dedupe:{x}:r:-:k"));
        assert_eq!(
            StoredResponse::decode(&enc, &StoreKey::from_raw("dedupe:{x}:r:-:k")).unwrap(),
            r
        );
    }
}

#[test]
fn an_unknown_expiry_round_trips_and_a_version_no_writer_makes_is_refused() {
    let mut r = sample(StoredBody::TooLarge);
    r.expires = None;
    let k = StoreKey::from_raw("k");
    assert_eq!(StoredResponse::decode(&r.encode(&k), &k).unwrap(), r);
    // `DGR1` (the layout without the expiry field) was written by pre-release builds only.
    let mut v1 = b"DGR1".to_vec();
    v1.extend_from_slice(&[0, 1, b'k', 0, 201, 1, 0, 0]);
    let v1 = Bytes::from(v1);
    assert_eq!(
        StoredResponse::decode(&v1, &k),
        Err(RecordError::Corrupt("bad magic"))
    );
}

#[test]
fn refuses_a_record_of_another_key() {
    let enc = sample(StoredBody::TooLarge).encode(&StoreKey::from_raw("k1"));
    assert_eq!(
        StoredResponse::decode(&enc, &StoreKey::from_raw("k2")),
        Err(RecordError::WrongKey)
    );
    assert_eq!(
        StoredResponse::decode(&enc, &StoreKey::from_raw("k")),
        Err(RecordError::WrongKey)
    );
}

#[test]
fn refuses_corrupt_records_without_panicking() {
    let enc =
        sample(StoredBody::Stored(Bytes::from_static(b"hello"))).encode(&StoreKey::from_raw("k"));
    for cut in 0..enc.len() {
        assert!(
            StoredResponse::decode(&enc.slice(..cut), &StoreKey::from_raw("k")).is_err(),
            "cut at {cut}"
        );
    }
    let mut extra = enc.to_vec();
    extra.push(0);
    assert!(StoredResponse::decode(&Bytes::from(extra), &StoreKey::from_raw("k")).is_err());
    assert!(
        StoredResponse::decode(&Bytes::from_static(b"nope"), &StoreKey::from_raw("k")).is_err()
    );
}

#[test]
fn a_hostile_field_count_in_a_large_record_is_refused_without_panicking() {
    // A count of 65,535 where a header map holds about 24,000, and bytes enough that
    // the count is not ruled out by the record's length alone.
    let k = StoreKey::from_raw("k");
    let mut record = b"DGR2".to_vec();
    record.extend_from_slice(&[0, 1, b'k']);
    record.extend_from_slice(&[0; 8]);
    record.extend_from_slice(&[0, 200, 0, 0xff, 0xff]);
    for i in 0..40_000u32 {
        let name = format!("x{i}");
        record.extend_from_slice(&(name.len() as u16).to_be_bytes());
        record.extend_from_slice(name.as_bytes());
        record.extend_from_slice(&1u32.to_be_bytes());
        record.push(b'v');
    }
    let record = Bytes::from(record);
    assert!(StoredResponse::decode(&record, &k).is_err());
}

#[test]
fn random_bytes_never_panic() {
    // A fixed xorshift stream: hostile or corrupted store contents must decode to an
    // error, never a panic or a replay.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let valid =
        sample(StoredBody::Stored(Bytes::from_static(b"body"))).encode(&StoreKey::from_raw("k"));
    for round in 0u32..5000 {
        let mut bytes = if round.is_multiple_of(2) {
            valid.to_vec()
        } else {
            b"DGR2".to_vec()
        };
        let len = (x % 64) as usize;
        for _ in 0..len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = (x as usize) % (bytes.len() + 1);
            if at < bytes.len() && x.is_multiple_of(3) {
                bytes[at] = (x >> 8) as u8;
            } else {
                bytes.insert(at.min(bytes.len()), (x >> 16) as u8);
            }
        }
        let bytes = Bytes::from(bytes);
        let k = StoreKey::from_raw("k");
        // An error or a record: never a panic.
        let _ = StoredResponse::decode(&bytes, &k);
    }
}

#[test]
fn a_record_never_keeps_a_framing_field_written_or_read() {
    let mut r = sample(StoredBody::Stored(Bytes::from_static(b"SAFE and the rest")));
    let k = StoreKey::from_raw("k");
    let clean = r.clone();
    for (name, value) in [
        ("content-length", "4"),
        ("transfer-encoding", "chunked"),
        ("connection", "close"),
        ("keep-alive", "timeout=5"),
    ] {
        r.headers.append(name, HeaderValue::from_static(value));
    }
    r.trailers
        .append("content-length", HeaderValue::from_static("4"));
    let written = r.encode(&k);
    assert_eq!(
        written,
        clean.encode(&k),
        "stored as if they were never there"
    );
    assert_eq!(StoredResponse::decode(&written, &k).unwrap(), clean);
    // A record written before the rule: its framing fields are never read back.
    let mut clean = clean;
    clean.trailers.clear();
    let mut old = BytesMut::from(&clean.encode(&k)[..]);
    let fields_at = 4 + 2 + 1 + 8 + 2 + 1;
    let count = u16::from_be_bytes([old[fields_at], old[fields_at + 1]]);
    old[fields_at..fields_at + 2].copy_from_slice(&(count + 1).to_be_bytes());
    let mut field = BytesMut::new();
    put_u16_bytes(&mut field, b"content-length");
    field.put_u32(1);
    field.put_slice(b"4");
    let old = [&old[..fields_at + 2], &field[..], &old[fields_at + 2..]].concat();
    let old = Bytes::from(old);
    let decoded = StoredResponse::decode(&old, &k).unwrap();
    assert!(
        !decoded.headers.contains_key("content-length"),
        "{decoded:?}"
    );
    assert!(decoded.headers.contains_key("content-type"), "{decoded:?}");
}

/// Bounded property tests (issue 55's safety net; cargo-fuzz cannot run in CI here): a few
/// hundred small cases each, so the whole set runs in about a second under `cargo test`.
mod properties {
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;
    use proptest::sample::select;

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: 256,
            // A failure prints its minimal case; nothing is written into the source tree.
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// The framing and hop-by-hop fields a record never keeps, among ordinary names.
    const NAMED: &[&str] = &[
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "upgrade",
        "proxy-authenticate",
        "proxy-authorization",
        "content-type",
        "grpc-status",
        "set-cookie",
        "x-multi",
    ];

    fn name() -> impl Strategy<Value = HeaderName> {
        let token = vec(
            select(b"abcdefghijklmnopqrstuvwxyz0123456789-_!#$%&'*+.^`|~".to_vec()),
            1..16,
        );
        prop_oneof![
            select(NAMED).prop_map(HeaderName::from_static),
            token.prop_map(|b| HeaderName::from_bytes(&b).unwrap()),
        ]
    }

    fn value() -> impl Strategy<Value = HeaderValue> {
        // Every byte a header value takes: tab, visible ASCII, space, obs-text.
        let bytes: Vec<u8> = (0..=255u8)
            .filter(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
            .collect();
        vec(select(bytes), 0..24).prop_map(|b| HeaderValue::from_bytes(&b).unwrap())
    }

    fn fields(max: usize) -> impl Strategy<Value = HeaderMap> {
        vec((name(), value()), 0..max).prop_map(|fields| {
            let mut map = HeaderMap::new();
            for (n, v) in fields {
                map.append(n, v);
            }
            map
        })
    }

    fn body() -> impl Strategy<Value = StoredBody> {
        prop_oneof![
            vec(any::<u8>(), 0..64).prop_map(|b| StoredBody::Stored(b.into())),
            Just(StoredBody::TooLarge),
            Just(StoredBody::Incomplete),
            Just(StoredBody::NotStored),
        ]
    }

    fn response() -> impl Strategy<Value = StoredResponse> {
        (
            100..=999u16,
            fields(10),
            body(),
            proptest::option::of(1..=u64::from(u32::MAX) * 4),
            fields(4),
        )
            .prop_map(
                |(status, headers, body, expires, trailers)| StoredResponse {
                    status: StatusCode::from_u16(status).unwrap(),
                    headers,
                    body,
                    expires: expires.map(|s| UNIX_EPOCH + Duration::from_secs(s)),
                    trailers,
                },
            )
    }

    fn key() -> impl Strategy<Value = String> {
        vec(select(b"abc:{}-_0123456789".to_vec()), 0..24)
            .prop_map(|b| String::from_utf8(b).unwrap())
    }

    /// `map` without the fields a record never keeps.
    fn unframed(map: &HeaderMap) -> HeaderMap {
        let mut out = HeaderMap::new();
        for (n, v) in map {
            if !crate::protocol::hop_by_hop::is_framing(n.as_str().as_bytes()) {
                out.append(n.clone(), v.clone());
            }
        }
        out
    }

    /// The decoder on any bytes: it never panics, and what it reads is a record a header
    /// map holds (no framing field).
    fn decodes_safely(bytes: &Bytes, k: &StoreKey) {
        if let Ok(read) = StoredResponse::decode(bytes, k) {
            assert_eq!(unframed(&read.headers), read.headers);
        }
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn arbitrary_bytes_never_panic(
            magic in select(vec![&b"DGR3"[..], b"DGR2", b"DGR1", b"DGRX", b""]),
            with_key in any::<bool>(),
            rest in vec(any::<u8>(), 0..256),
        ) {
            // After a real magic and key, so the cases reach the fields, not only the magic.
            let mut bytes = magic.to_vec();
            if with_key {
                bytes.extend_from_slice(&[0, 1, b'k']);
            }
            bytes.extend_from_slice(&rest);
            decodes_safely(&Bytes::from(bytes), &StoreKey::from_raw("k"));
        }

        #[test]
        fn a_written_record_with_bytes_changed_or_cut_never_panics(
            r in response(),
            changes in vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
            cut in any::<prop::sample::Index>(),
            cut_it in any::<bool>(),
        ) {
            let k = StoreKey::from_raw("k");
            let mut bytes = r.encode(&k).to_vec();
            for (at, b) in changes {
                let at = at.index(bytes.len());
                bytes[at] = b;
            }
            if cut_it {
                bytes.truncate(cut.index(bytes.len() + 1));
            }
            decodes_safely(&Bytes::from(bytes), &k);
        }

        #[test]
        fn every_written_record_decodes_to_the_response_without_framing(
            r in response(),
            k in key(),
        ) {
            let k = StoreKey::from_raw(k);
            let written = r.encode(&k);
            let want = StoredResponse {
                headers: unframed(&r.headers),
                trailers: unframed(&r.trailers),
                ..r.clone()
            };
            prop_assert_eq!(StoredResponse::decode(&written, &k), Ok(want));
        }

        #[test]
        fn a_record_read_under_another_key_is_refused(
            r in response(),
            k in key(),
            other in key(),
        ) {
            prop_assume!(k != other);
            let written = r.encode(&StoreKey::from_raw(k));
            let other = StoreKey::from_raw(other);
            prop_assert_eq!(StoredResponse::decode(&written, &other), Err(RecordError::WrongKey));
        }
    }
}

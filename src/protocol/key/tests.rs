use super::*;
use http::HeaderValue;

struct Req {
    method: Method,
    path: String,
    query: Option<String>,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Req {
    fn new(body: &str) -> Self {
        Self {
            method: Method::POST,
            path: "/webhooks/x".into(),
            query: None,
            headers: HeaderMap::new(),
            body: body.as_bytes().to_vec(),
        }
    }
    fn header(mut self, k: &'static str, v: &str) -> Self {
        self.headers.append(k, HeaderValue::from_str(v).unwrap());
        self
    }
    fn view(&self) -> RequestView<'_> {
        RequestView {
            method: &self.method,
            path: &self.path,
            query: self.query.as_deref(),
            headers: &self.headers,
            body: &self.body,
        }
    }
}

fn header_rule(required: bool) -> KeyRule {
    KeyRule::Header {
        name: HeaderName::from_static("idempotency-key"),
        alias: None,
        required,
    }
}

fn fp(parts: &[&str]) -> KeyRule {
    KeyRule::Fingerprint(
        parts
            .iter()
            .map(|p| RequestPart::parse(p).unwrap())
            .collect(),
    )
}

#[test]
fn header_keys_are_validated() {
    let ok = Req::new("").header("Idempotency-Key", "abc-123");
    assert_eq!(
        header_rule(true).derive(&ok.view()).unwrap().as_deref(),
        Some("abc-123")
    );
    let missing = Req::new("");
    assert!(matches!(
        header_rule(true).derive(&missing.view()),
        Err(KeyError::Missing { .. })
    ));
    assert_eq!(header_rule(false).derive(&missing.view()).unwrap(), None);
    for bad in ["", "has space", &"x".repeat(256), "tab\there"] {
        let r = Req::new("").header("Idempotency-Key", bad);
        assert!(
            matches!(
                header_rule(true).derive(&r.view()),
                Err(KeyError::Invalid { .. })
            ),
            "{bad:?}"
        );
    }
    let long = Req::new("").header("Idempotency-Key", &"x".repeat(MAX_KEY_LEN));
    assert!(header_rule(true).derive(&long.view()).is_ok());
    let longer = Req::new("").header("Idempotency-Key", &"x".repeat(MAX_KEY_LEN + 1));
    let refused = header_rule(true).derive(&longer.view()).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains(&format!("1 to {MAX_KEY_LEN} ")),
        "the message names the real bound: {refused}"
    );
    let twice = Req::new("")
        .header("Idempotency-Key", "a")
        .header("Idempotency-Key", "b");
    assert!(header_rule(true).derive(&twice.view()).is_err());
}

#[test]
fn sf_string_and_bare_keys_are_the_same_key() {
    let key = |v: &str| header_rule(true).derive(&Req::new("").header("Idempotency-Key", v).view());
    assert_eq!(key("8e03978e").unwrap(), key("\"8e03978e\"").unwrap());
    assert_eq!(key("\"8e03978e\"").unwrap().as_deref(), Some("8e03978e"));
    assert_eq!(key(r#""a\"b\\c""#).unwrap().as_deref(), Some(r#"a"b\c"#));
    assert_eq!(
        key(r#"a"b"#).unwrap().as_deref(),
        Some(r#"a"b"#),
        "bare keys keep quotes inside"
    );
    for bad in [
        "\"unterminated",
        "\"",
        "\"\"",
        "\"a\"b",
        "\"a\";p=1",
        r#""a\x""#,
        r#""a\""#,
        "\"has space\"",
    ] {
        assert!(
            matches!(key(bad), Err(KeyError::Invalid { .. })),
            "{bad:?} -> {:?}",
            key(bad)
        );
    }
    let long = format!("\"{}\"", "x".repeat(255));
    assert!(
        key(&long).is_ok(),
        "the quotes do not count toward the length"
    );
}

#[test]
fn fingerprint_is_stable_and_ignores_unlisted_fields() {
    let rule = fp(&[
        "method",
        "path",
        "json:/order_id",
        "json:/event_type",
        "header:X-Source",
    ]);
    let a = Req::new(r#"{"order_id": 7, "event_type": "paid", "sent_at": 1}"#)
        .header("X-Source", "shop");
    let b = Req::new(r#"{"sent_at": 2, "event_type": "paid", "order_id": 7}"#)
        .header("X-Source", "shop");
    let ka = rule.derive(&a.view()).unwrap().unwrap();
    assert_eq!(ka.len(), 64);
    assert_eq!(ka, rule.derive(&b.view()).unwrap().unwrap());
    let other = Req::new(r#"{"order_id": 8, "event_type": "paid"}"#).header("X-Source", "shop");
    assert_ne!(ka, rule.derive(&other.view()).unwrap().unwrap());
    let no_source = Req::new(r#"{"order_id": 7, "event_type": "paid"}"#);
    assert_ne!(ka, rule.derive(&no_source.view()).unwrap().unwrap());
}

#[test]
fn fingerprint_parts_cannot_be_shifted_into_each_other() {
    let rule = fp(&["json:/a", "json:/b"]);
    let x = Req::new(r#"{"a": "ab", "b": "c"}"#);
    let y = Req::new(r#"{"a": "a", "b": "bc"}"#);
    assert_ne!(
        rule.derive(&x.view()).unwrap(),
        rule.derive(&y.view()).unwrap()
    );
    let typed = fp(&["json:/a"]);
    let s = Req::new(r#"{"a": "42"}"#);
    let n = Req::new(r#"{"a": 42}"#);
    assert_ne!(
        typed.derive(&s.view()).unwrap(),
        typed.derive(&n.view()).unwrap()
    );
    // An absent header and an empty header differ.
    let h = fp(&["header:X-A"]);
    assert_ne!(
        h.derive(&Req::new("").view()).unwrap(),
        h.derive(&Req::new("").header("X-A", "").view()).unwrap()
    );
}

#[test]
fn fingerprint_errors_name_the_part() {
    let rule = fp(&["json:/order_id"]);
    assert!(matches!(
        rule.derive(&Req::new("{not json").view()),
        Err(KeyError::MalformedJson(_))
    ));
    let e = rule.derive(&Req::new(r#"{"id": 1}"#).view()).unwrap_err();
    assert_eq!(e, KeyError::MissingPart("json:/order_id".into()));
    assert!(e.to_string().contains("json:/order_id"));
}

#[test]
fn fingerprints_keep_integers_past_64_bits_and_refuse_duplicate_keys() {
    let rule = fp(&["json:/order_id"]);
    let a = Req::new(r#"{"order_id":100000000000000000000001}"#);
    let b = Req::new(r#"{"order_id":100000000000000000000002}"#);
    assert_ne!(
        rule.derive(&a.view()).unwrap(),
        rule.derive(&b.view()).unwrap()
    );
    // An ordinary integer hashes as it always did (serde_json's canonical text).
    let old = {
        let mut h = Sha256::new();
        h.update(b"dedupe-gateway/fingerprint/v1");
        h.update([6u8]);
        field(&mut h, Some(b"7"));
        hex::encode(h.finalize())
    };
    let seven = Req::new(r#"{ "order_id" : 7 }"#);
    assert_eq!(rule.derive(&seven.view()).unwrap().unwrap(), old);
    let dup = Req::new(r#"{"order_id":1,"order_id":2}"#);
    let e = rule.derive(&dup.view()).unwrap_err();
    assert_eq!(e, KeyError::DuplicateJsonKey("order_id".into()));
    // Anywhere in the body, not only on the fingerprinted path.
    let elsewhere = Req::new(r#"{"order_id":1,"meta":{"x":1,"x":2}}"#);
    assert!(matches!(
        rule.derive(&elsewhere.view()),
        Err(KeyError::DuplicateJsonKey(_))
    ));
}

#[test]
fn request_hash_covers_method_path_query_body_and_listed_headers() {
    let request_hash = |v: &RequestView<'_>, h: &[HeaderName]| {
        super::request_hash(v, &MatchRule::Request, h).unwrap()
    };
    let base = Req::new("{}");
    let h = request_hash(&base.view(), &[]);
    let mut q = Req::new("{}");
    q.query = Some("a=1".into());
    assert_ne!(h, request_hash(&q.view(), &[]));
    let mut empty_q = Req::new("{}");
    empty_q.query = Some(String::new());
    assert_ne!(h, request_hash(&empty_q.view(), &[]));
    assert_ne!(h, request_hash(&Req::new("{} ").view(), &[]));
    let mut m = Req::new("{}");
    m.method = Method::PATCH;
    assert_ne!(h, request_hash(&m.view(), &[]));
    let name = HeaderName::from_static("x-amount");
    let with = Req::new("{}").header("X-Amount", "5");
    assert_eq!(
        h,
        request_hash(&with.view(), &[]),
        "unlisted headers are ignored"
    );
    assert_ne!(
        request_hash(&with.view(), std::slice::from_ref(&name)),
        request_hash(&base.view(), &[name])
    );
}

#[test]
fn matching_named_parts_ignores_everything_else_and_key_order() {
    let rule = MatchRule::Parts(vec![
        RequestPart::parse("json:/id").unwrap(),
        RequestPart::parse("json:/data").unwrap(),
    ]);
    let h = |body: &str| request_hash(&Req::new(body).view(), &rule, &[]);
    let first = h(r#"{"id":"evt_1","data":{"a":1,"b":2},"attempt":1}"#).unwrap();
    assert_eq!(
        first,
        h(r#"{"attempt":2, "data":{"b":2,"a":1}, "id":"evt_1"}"#).unwrap()
    );
    assert_ne!(first, h(r#"{"id":"evt_1","data":{"a":1,"b":3}}"#).unwrap());
    assert_eq!(
        h(r#"{"id":"evt_1"}"#).unwrap_err(),
        KeyError::MissingPart("json:/data".into())
    );
    // The key alone: every repeat is a replay.
    let key_only = MatchRule::Parts(vec![]);
    let a = request_hash(&Req::new("a").view(), &key_only, &[]).unwrap();
    assert_eq!(
        a,
        request_hash(&Req::new("b").view(), &key_only, &[]).unwrap()
    );
    // hash_headers still count.
    let x = HeaderName::from_static("x-amount");
    let with = |v| {
        request_hash(
            &Req::new("").header("X-Amount", v).view(),
            &key_only,
            std::slice::from_ref(&x),
        )
        .unwrap()
    };
    assert_ne!(with("1"), with("2"));
    // Never equal to the whole-request hash of the same request.
    let r = Req::new("{}");
    assert_ne!(
        request_hash(&r.view(), &MatchRule::Request, &[]).unwrap(),
        request_hash(
            &r.view(),
            &MatchRule::Parts(vec![
                RequestPart::Method,
                RequestPart::Path,
                RequestPart::Query,
                RequestPart::Body
            ]),
            &[]
        )
        .unwrap()
    );
}

#[test]
fn scopes_isolate_tenants() {
    let parts = vec![RequestPart::parse("header:Authorization").unwrap()];
    let a = Req::new("").header("Authorization", "Bearer a");
    let b = Req::new("").header("Authorization", "Bearer b");
    let sa = scope_hash(&parts, &a.view()).unwrap();
    assert_eq!(sa.len(), 32);
    assert_ne!(sa, scope_hash(&parts, &b.view()).unwrap());
    assert_eq!(scope_hash(&[], &a.view()).unwrap(), "-");
    let ka = store_key("dedupe", "payments", &sa, "k1");
    let kb = store_key(
        "dedupe",
        "payments",
        &scope_hash(&parts, &b.view()).unwrap(),
        "k1",
    );
    assert_ne!(ka, kb);
    let ka = ka.as_str();
    assert!(ka.starts_with("dedupe:{"), "{ka}");
    assert!(ka.ends_with(&format!(":payments:{sa}:k1")), "{ka}");
}

#[test]
fn store_keys_hash_tag_ignores_braces_in_client_keys() {
    let k = store_key("p", "r", "-", "{evil}x");
    let k = k.as_str();
    let open = k.find('{').unwrap();
    let close = k[open..].find('}').unwrap() + open;
    assert_eq!(
        close - open - 1,
        12,
        "the tag is ours, not the client's: {k}"
    );
}

#[test]
fn parts_parse_and_print() {
    for s in [
        "method",
        "path",
        "query",
        "body",
        "header:x-source",
        "json:/a/0",
    ] {
        assert_eq!(RequestPart::parse(s).unwrap().to_string(), s);
    }
    assert!(RequestPart::parse("cookie:a").is_err());
}

#[test]
fn a_quoted_key_is_forwarded_as_an_sf_string_of_itself() {
    assert_eq!(forwarded_key("abc"), "abc");
    assert_eq!(forwarded_key("a\"b"), "a\"b");
    let quoted = forwarded_key("\"a\\b\"");
    assert_eq!(quoted, r#""\"a\\b\"""#);
    assert_eq!(sf_string(quoted.as_bytes()).unwrap(), b"\"a\\b\"");
}

#[test]
fn a_store_key_is_spelt_as_before() {
    // The spelling records already stored under: `prefix:{tag}:route:scope:key`, the tag
    // the first six bytes of the slot hash in lower-case hex.
    let mut h = Sha256::new();
    h.update(b"dedupe-gateway/slot/v1");
    for part in ["payments", "-", "order-7"] {
        h.update([1u8]);
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    let tag = hex::encode(&h.finalize()[..6]);
    assert_eq!(
        store_key("dedupe", "payments", "-", "order-7").as_str(),
        format!("dedupe:{{{tag}}}:payments:-:order-7")
    );
}

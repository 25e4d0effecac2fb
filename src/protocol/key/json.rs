//! Just enough JSON for fingerprints: a strict RFC 8259 reader that keeps every number as
//! the exact text the client sent and refuses an object with a duplicated key.
//!
//! A generic JSON library reads numbers into `u64`/`i64`/`f64`: integers past 64 bits then
//! collapse onto the same float, and two different events share a fingerprint (the
//! second gets 422 and is never executed). And a library keeps one of two duplicated keys
//! while the upstream may keep the other: the key would describe a different request than
//! the one executed. Both would poison the store, so numbers are text here and duplicates
//! are an error.
//!
//! The canonical encoding is what `serde_json::to_vec` wrote for the same value before
//! (keys sorted, no whitespace, strings escaped alike), except that numbers are their
//! original text: fingerprints of ordinary bodies did not change.

use std::borrow::Cow;
use std::collections::BTreeMap;

/// serde_json's nesting limit: recursion depth stays bounded whatever the body.
const MAX_DEPTH: usize = 128;

/// A parsed JSON value, borrowing from the body where it can.
#[derive(Debug, PartialEq)]
pub(super) enum Value<'a> {
    /// `null`, `true`, `false` or a number, as written.
    Literal(&'a str),
    /// A string, unescaped.
    Str(Cow<'a, str>),
    /// An array.
    Array(Vec<Value<'a>>),
    /// An object; keys unescaped and unique.
    Object(BTreeMap<Cow<'a, str>, Value<'a>>),
}

/// Why a body is not usable JSON.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum JsonError {
    /// Not JSON: where and what.
    Syntax(String),
    /// An object names this key twice.
    DuplicateKey(String),
}

/// Parses a whole body.
pub(super) fn parse(body: &[u8]) -> Result<Value<'_>, JsonError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| JsonError::Syntax(format!("invalid UTF-8 at byte {}", e.valid_up_to())))?;
    let mut p = Parser {
        text,
        pos: 0,
        depth: 0,
    };
    p.ws();
    let v = p.value()?;
    p.ws();
    if p.pos != text.len() {
        return Err(p.error("trailing characters after the JSON value"));
    }
    Ok(v)
}

impl Value<'_> {
    /// The value at an RFC 6901 pointer (`""` is the whole value), as serde_json resolves it.
    pub(super) fn pointer(&self, pointer: &str) -> Option<&Self> {
        if pointer.is_empty() {
            return Some(self);
        }
        pointer
            .strip_prefix('/')?
            .split('/')
            .try_fold(self, |v, token| {
                let token = token.replace("~1", "/").replace("~0", "~");
                match v {
                    Value::Object(m) => m.get(token.as_str()),
                    Value::Array(a) => index(&token).and_then(|i| a.get(i)),
                    _ => None,
                }
            })
    }

    /// Appends the canonical encoding: keys sorted, no whitespace, numbers as written.
    pub(super) fn canonical(&self, out: &mut Vec<u8>) {
        match self {
            Value::Literal(t) => out.extend_from_slice(t.as_bytes()),
            Value::Str(s) => string(s, out),
            Value::Array(items) => {
                out.push(b'[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    v.canonical(out);
                }
                out.push(b']');
            }
            Value::Object(m) => {
                out.push(b'{');
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    string(k, out);
                    out.push(b':');
                    v.canonical(out);
                }
                out.push(b'}');
            }
        }
    }
}

fn string(s: &str, out: &mut Vec<u8>) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// An array index token: digits without a leading zero (as serde_json's pointer).
fn index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
        return None;
    }
    token.parse().ok()
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn error(&self, what: &str) -> JsonError {
        JsonError::Syntax(format!("{what} at byte {}", self.pos))
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn expect(&mut self, b: u8, what: &str) -> Result<(), JsonError> {
        if self.peek() != Some(b) {
            return Err(self.error(what));
        }
        self.pos += 1;
        Ok(())
    }

    fn value(&mut self) -> Result<Value<'a>, JsonError> {
        match self.peek() {
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => Ok(Value::Str(self.string()?)),
            Some(b't') => self.literal("true"),
            Some(b'f') => self.literal("false"),
            Some(b'n') => self.literal("null"),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.error("expected a value")),
            None => Err(self.error("unexpected end of input")),
        }
    }

    fn nest(&mut self) -> Result<(), JsonError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.error("nested too deeply"));
        }
        self.pos += 1;
        self.ws();
        Ok(())
    }

    fn object(&mut self) -> Result<Value<'a>, JsonError> {
        self.nest()?;
        let mut map = BTreeMap::new();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            self.depth -= 1;
            return Ok(Value::Object(map));
        }
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                return Err(self.error("expected an object key"));
            }
            let key = self.string()?;
            self.ws();
            self.expect(b':', "expected ':'")?;
            self.ws();
            let value = self.value()?;
            if map.contains_key(&key) {
                return Err(JsonError::DuplicateKey(key.into_owned()));
            }
            map.insert(key, value);
            self.ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => break,
                _ => return Err(self.error("expected ',' or '}'")),
            }
        }
        self.pos += 1;
        self.depth -= 1;
        Ok(Value::Object(map))
    }

    fn array(&mut self) -> Result<Value<'a>, JsonError> {
        self.nest()?;
        let mut items = Vec::new();
        if self.peek() == Some(b']') {
            self.pos += 1;
            self.depth -= 1;
            return Ok(Value::Array(items));
        }
        loop {
            self.ws();
            items.push(self.value()?);
            self.ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => break,
                _ => return Err(self.error("expected ',' or ']'")),
            }
        }
        self.pos += 1;
        self.depth -= 1;
        Ok(Value::Array(items))
    }

    fn string(&mut self) -> Result<Cow<'a, str>, JsonError> {
        let open = self.pos;
        self.pos += 1;
        let mut escaped = false;
        loop {
            match self.peek() {
                None => return Err(self.error("unterminated string")),
                Some(b'"') => break,
                Some(b'\\') => {
                    escaped = true;
                    self.pos += 2;
                }
                Some(0..=0x1f) => return Err(self.error("control character in a string")),
                Some(_) => self.pos += 1,
            }
        }
        self.pos += 1;
        let raw = self
            .text
            .get(open..self.pos)
            .ok_or_else(|| self.error("unterminated string"))?;
        if !escaped {
            return Ok(Cow::Borrowed(&raw[1..raw.len() - 1]));
        }
        // Escapes (surrogate pairs included) are decoded by serde_json, which also
        // refuses invalid ones.
        serde_json::from_str::<String>(raw)
            .map(Cow::Owned)
            .map_err(|e| JsonError::Syntax(format!("invalid string at byte {open}: {e}")))
    }

    fn literal(&mut self, word: &'static str) -> Result<Value<'a>, JsonError> {
        if !self.text[self.pos..].starts_with(word) {
            return Err(self.error("expected a value"));
        }
        let start = self.pos;
        self.pos += word.len();
        Ok(Value::Literal(&self.text[start..self.pos]))
    }

    fn number(&mut self) -> Result<Value<'a>, JsonError> {
        let start = self.pos;
        let digits = |p: &mut Self| {
            let from = p.pos;
            while matches!(p.peek(), Some(b'0'..=b'9')) {
                p.pos += 1;
            }
            p.pos > from
        };
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                digits(self);
            }
            _ => return Err(self.error("invalid number")),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if !digits(self) {
                return Err(self.error("invalid number"));
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if !digits(self) {
                return Err(self.error("invalid number"));
            }
        }
        Ok(Value::Literal(&self.text[start..self.pos]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(text: &str) -> String {
        let mut out = Vec::new();
        parse(text.as_bytes()).unwrap().canonical(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn canonical_matches_serde_json_for_ordinary_values() {
        for text in [
            r#"{"b": [1, -2, 0, true, null, "x\"\\\n\u0001é"], "a": {"z": {}, "y": []}}"#,
            r#"  "plain"  "#,
            r#"{"k\u0061": "\ud83d\ude00", "": 12.5}"#,
            "[0, -7, 18446744073709551615, -9223372036854775808, 3.25, 1.5e-7]",
        ] {
            let v: serde_json::Value = serde_json::from_str(text).unwrap();
            assert_eq!(canon(text), serde_json::to_string(&v).unwrap(), "{text}");
        }
    }

    #[test]
    fn numbers_keep_their_exact_text() {
        assert_eq!(
            canon("100000000000000000000001"),
            "100000000000000000000001"
        );
        assert_ne!(
            canon("100000000000000000000001"),
            canon("100000000000000000000002")
        );
        assert_eq!(canon("[1.50, 1E2, -0]"), "[1.50,1E2,-0]");
    }

    #[test]
    fn duplicate_keys_are_refused_even_when_spelled_differently() {
        for text in [
            r#"{"order_id": 1, "order_id": 2}"#,
            r#"{"a": {"x": 1, "\u0078": 1}}"#,
            r#"[{"a": 1}, {"b": 1, "b": 1}]"#,
        ] {
            assert!(
                matches!(parse(text.as_bytes()), Err(JsonError::DuplicateKey(_))),
                "{text}"
            );
        }
    }

    #[test]
    fn invalid_json_is_refused() {
        for text in [
            "",
            "{",
            "{\"a\" 1}",
            "[1,]",
            "01",
            "1.",
            "-",
            "1e",
            "tru",
            "\"a",
            "{} x",
            "\"\t\"",
            "\"\\x\"",
            "{\"a\":1,}",
            "\"\\ud800\"",
            "NaN",
            "+1",
        ] {
            assert!(
                matches!(parse(text.as_bytes()), Err(JsonError::Syntax(_))),
                "{text:?}"
            );
        }
        assert!(parse(&[b'"', 0xff, b'"']).is_err());
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert!(parse(deep.as_bytes()).is_err());
        let ok = "[".repeat(100) + &"]".repeat(100);
        assert!(parse(ok.as_bytes()).is_ok());
    }

    #[test]
    fn pointers_resolve_as_serde_json_does() {
        let text = r#"{"a/b": {"m~n": [10, 20]}, "list": [{"id": 7}], "": 1}"#;
        let ours = parse(text.as_bytes()).unwrap();
        let theirs: serde_json::Value = serde_json::from_str(text).unwrap();
        for p in [
            "",
            "/a~1b",
            "/a~1b/m~0n/1",
            "/list/0/id",
            "/list/01",
            "/list/+0",
            "/list/1",
            "/",
            "/missing",
            "/a~1b/m~0n/x",
            "list",
        ] {
            let mine = ours.pointer(p).map(|v| {
                let mut out = Vec::new();
                v.canonical(&mut out);
                String::from_utf8(out).unwrap()
            });
            let expected = theirs.pointer(p).map(|v| serde_json::to_string(v).unwrap());
            assert_eq!(mine, expected, "{p:?}");
        }
    }
}

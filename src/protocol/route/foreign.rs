//! Route paths written in another framework's syntax. `/v1/payments/{id}`,
//! `/v1/payments/:id` and `/v1/payments/.*` are what a user writes first, and each is a
//! valid glob that matches no request the user meant: dedupe would be off without a word.
//! So they are refused when the configuration is validated, saying what this gateway's
//! patterns mean. Pure: unit-tested here.

/// What this gateway's path patterns mean, for every refusal of a foreign one.
const PATTERN_SYNTAX: &str = "patterns here are an exact path or a glob: `*` matches any run \
     of characters, slashes included; `P/**` is `P` and everything under it; `?` is one \
     character, `[ab]` one of a set, `{a,b}` either alternative. A literal brace is \
     written %7B (and %7D)";

/// Tokens of a regular expression that a glob reads literally (or, for `^` and `$`, as
/// anything but an anchor). `[^...]` is included: globset would read it as a negated class,
/// but it is the regex spelling; a glob negates with `[!...]`.
const REGEX_TOKENS: [&str; 8] = [".*", ".+", "]+", "\\d", "\\w", "\\s", "^", "\\."];

/// Why `pattern` is another framework's syntax, with the pattern to write where there is
/// one; `None` for a pattern in this gateway's own syntax.
pub(super) fn refusal(pattern: &str) -> Option<String> {
    if let Some(param) = path_parameter(pattern) {
        let instead = pattern.replacen(param.token, "*", 1);
        return Some(format!(
            "{pattern:?} has a path parameter in {} syntax ({}), which this gateway reads \
             literally, so no request would match it; write {instead:?}: {PATTERN_SYNTAX}",
            param.frameworks, param.token,
        ));
    }
    if let Some(token) = regex_token(pattern) {
        let instead = match token {
            ".*" | ".+" => format!("; write {:?}", pattern.replace(token, "*")),
            _ => String::new(),
        };
        return Some(format!(
            "{pattern:?} is a regular expression ({token}), which this gateway reads as a \
             glob, so it would not match the paths it means{instead}: {PATTERN_SYNTAX}"
        ));
    }
    None
}

/// A path parameter found in a pattern: its text and whose syntax it is.
struct PathParameter<'p> {
    token: &'p str,
    frameworks: &'static str,
}

/// `{name}` (a brace group with no comma: a glob alternation has at least two
/// alternatives) or a segment starting with `:`.
fn path_parameter(pattern: &str) -> Option<PathParameter<'_>> {
    let mut rest = pattern;
    let mut offset = 0;
    while let Some(open) = rest.find('{') {
        let Some(len) = rest[open..].find('}') else {
            break;
        };
        let group = &rest[open..=open + len];
        if !group.contains(',') {
            let start = offset + open;
            return Some(PathParameter {
                token: &pattern[start..start + group.len()],
                frameworks: "OpenAPI, Axum or Spring",
            });
        }
        offset += open + len + 1;
        rest = &rest[open + len + 1..];
    }
    pattern
        .split('/')
        .find(|segment| segment.starts_with(':'))
        .map(|segment| PathParameter {
            token: segment,
            frameworks: "Express or Rails",
        })
}

/// The first regular-expression token in `pattern`: one of [`REGEX_TOKENS`], a `$` at the
/// end, or a group of alternatives `(a|b)`.
fn regex_token(pattern: &str) -> Option<&'static str> {
    if let Some(token) = REGEX_TOKENS.iter().find(|t| pattern.contains(**t)) {
        return Some(token);
    }
    if pattern.ends_with('$') {
        return Some("$");
    }
    let group = pattern
        .split_once('(')
        .and_then(|(_, after)| after.split_once(')'))
        .is_some_and(|(inside, _)| inside.contains('|'));
    group.then_some("(...|...)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_parameters_are_found_and_replaced_by_a_star() {
        for (pattern, instead) in [
            ("/v1/payments/{id}", "/v1/payments/*"),
            ("/v1/{orders,payments}/{id}/x", "/v1/{orders,payments}/*/x"),
            ("/v1/payments/{}", "/v1/payments/*"),
            ("/v1/payments/:id", "/v1/payments/*"),
            ("/v1/payments/:id/refunds", "/v1/payments/*/refunds"),
        ] {
            let e = refusal(pattern).unwrap_or_else(|| panic!("{pattern} accepted"));
            assert!(e.contains("path parameter"), "{e}");
            assert!(e.contains(&format!("write {instead:?}")), "{pattern}: {e}");
        }
    }

    #[test]
    fn regular_expressions_are_found() {
        for (pattern, token) in [
            ("/v1/payments/.*", ".*"),
            ("/v1/payments/.+", ".+"),
            ("/v1/payments/[0-9]+", "]+"),
            ("/v1/payments/\\d+", "\\d"),
            ("/v1/\\w+/x", "\\w"),
            ("/v1/payments/[^/]*", "^"),
            ("/v1/payments/x$", "$"),
            ("/v1/(orders|payments)/**", "(...|...)"),
        ] {
            let e = refusal(pattern).unwrap_or_else(|| panic!("{pattern} accepted"));
            assert!(e.contains(&format!("regular expression ({token})")), "{e}");
        }
        let e = refusal("/v1/payments/.*").unwrap();
        assert!(e.contains("write \"/v1/payments/*\""), "{e}");
    }

    #[test]
    fn this_gateway_s_own_patterns_pass() {
        for pattern in [
            "/v1/{orders,payments}/**",
            "/v1/{a,b}/{c,d}/*",
            "/v1/payments/*",
            "/v1/pay?ents/*",
            "/v1/[!a]/*",
            "/v1/payments/x:cancel",
            "/v1/payments.json",
            "/v1/%7Bid%7D",
            "/v1/$x/(y)",
            "/**",
        ] {
            assert_eq!(refusal(pattern), None, "{pattern}");
        }
    }
}

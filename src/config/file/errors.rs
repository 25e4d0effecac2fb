//! A route's `errors = ...` as written: a built-in dialect's name or a template table.

use serde::Deserialize;

use crate::protocol::route::dialect::BuiltIn;

/// `errors = ...` as written: `"problem"`, `"stripe"` or a template table.
#[derive(Debug, Clone)]
pub enum FileErrors {
    /// `"problem"` or `"stripe"`.
    BuiltIn(BuiltIn),
    /// `{ template = "path.json", content_type = "..." }`.
    Template(FileTemplate),
}

/// `errors = { template, content_type }` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a table like { template = \"errors.json\", content_type = \"application/json\" }"
)]
pub struct FileTemplate {
    /// The template file, relative to the working directory.
    pub template: String,
    /// The answers' `Content-Type`.
    pub content_type: Option<String>,
}

impl<'de> Deserialize<'de> for FileErrors {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = FileErrors;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "\"problem\", \"stripe\" or a table like { template = \"errors.json\" }",
                )
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<FileErrors, E> {
                BuiltIn::deserialize(serde::de::value::StrDeserializer::<E>::new(v))
                    .map(FileErrors::BuiltIn)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Str(v), &self))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<FileErrors, A::Error> {
                FileTemplate::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(FileErrors::Template)
            }
        }
        d.deserialize_any(Visitor)
    }
}

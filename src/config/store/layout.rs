//! `store.record_layout`: how the Redis backends keep a record.

use serde::Deserialize;

/// How the Redis backends keep a record (`store.record_layout`). Whatever the setting,
/// a gateway reads records of both layouts, so a fleet can change it one gateway at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", expecting = "\"hash\" or \"string\"")]
pub enum RecordLayout {
    /// One Redis hash per record, every step a Lua script: what earlier releases write.
    Hash,
    /// One Redis string per record (a binary header, then the response): a first claim and
    /// a replay are native commands; Lua only where a write must compare first.
    String,
}

impl RecordLayout {
    /// The name as written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordLayout::Hash => "hash",
            RecordLayout::String => "string",
        }
    }
}

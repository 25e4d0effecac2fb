//! The dedupe protocol's pure parts: the values a claim is made of, keys and
//! fingerprints, routes and their policies, stored records, webhook signatures, gRPC's
//! rules and what a proxy does to the fields between its two sides. No I/O here.

pub mod grpc;
pub mod headers;
pub mod hop_by_hop;
pub mod key;
pub mod path;
pub mod record;
pub mod route;
pub mod seal;
pub mod tokens;
pub mod verify;

//! The cache's S3 remote (the `cli` feature; a build script never talks to it): the client
//! ([`s3`]) and the transfers of `push`, `pull` and `store --to` ([`sync`]).

pub mod s3;
pub mod sync;

//! What is recorded, and where: `promptgen.lock` ([`lock`]), the steps' files in the
//! package's `promptgen/` folder or the content-addressed cache ([`store`], [`cache`]), the
//! pending area a build writes, and the folders of the target area ([`layout`]). Every read
//! is checked against the lock's hashes; every write is atomic.

pub mod cache;
pub mod commit;
pub mod layout;
pub mod lock;
pub mod process_lock;
pub mod records;
pub mod store;

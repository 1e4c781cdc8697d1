pub mod cache;
pub mod layout;
pub mod lock;
pub mod process_lock;
pub mod store;

#[cfg(feature = "online")]
pub mod decide;
pub mod status;

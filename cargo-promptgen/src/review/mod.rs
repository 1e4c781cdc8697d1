//! What a person sees and decides: `check`, `status` and `diff` ([`status`]), and what
//! happens to the results a build left pending, `accept` and `review` ([`decide`]).

pub mod decide;
pub mod status;

pub mod assess;

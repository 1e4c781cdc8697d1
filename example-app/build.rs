// Materialises the generated tree into $OUT_DIR/promptgen/ from promptgen.lock.
fn main() -> Result<(), cargo_promptgen::Error> {
    cargo_promptgen::build()
}

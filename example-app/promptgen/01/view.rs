/// The part of the greeting application that talks to the user.
pub trait View {
    /// Asks the user for their name and returns what they typed, without the line ending.
    ///
    /// Fails only when reading the input or writing the question fails.
    fn ask_name(&mut self) -> std::io::Result<String>;

    /// Shows `greeting` to the user as one line.
    fn show_greeting(&mut self, greeting: &str) -> std::io::Result<()>;
}

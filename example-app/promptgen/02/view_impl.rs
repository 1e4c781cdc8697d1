use std::io::{BufRead, Stdin, StdinLock, Stdout, Write};

use super::view::View;

/// A [`View`] on a terminal: it reads the name from `input` and writes to `output`.
pub struct TerminalView<R, W> {
    input: R,
    output: W,
}

impl<R: BufRead, W: Write> TerminalView<R, W> {
    /// A view that reads from `input` and writes to `output`.
    pub fn new(input: R, output: W) -> Self {
        TerminalView { input, output }
    }
}

impl TerminalView<StdinLock<'static>, Stdout> {
    /// A view on the locked standard input and the standard output.
    pub fn stdio() -> TerminalView<StdinLock<'static>, Stdout> {
        let stdin: Stdin = std::io::stdin();
        TerminalView::new(stdin.lock(), std::io::stdout())
    }
}

impl<R: BufRead, W: Write> View for TerminalView<R, W> {
    fn ask_name(&mut self) -> std::io::Result<String> {
        write!(self.output, "What is your name? ")?;
        self.output.flush()?;
        let mut line = String::new();
        self.input.read_line(&mut line)?;
        let name = line.strip_suffix('\n').unwrap_or(&line);
        let name = name.strip_suffix('\r').unwrap_or(name);
        Ok(name.to_string())
    }

    fn show_greeting(&mut self, greeting: &str) -> std::io::Result<()> {
        writeln!(self.output, "{greeting}")?;
        self.output.flush()
    }
}

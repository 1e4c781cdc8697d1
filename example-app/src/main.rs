//! The greeting app of the original article: it asks for your name and greets you.
//!
//! Every module under `generated` is written by a language model from the prompts in
//! `../prompts` (one step per file, see `Cargo.toml`), recorded in `promptgen.lock` and
//! `promptgen/`, and placed in `$OUT_DIR/promptgen/` by `build.rs`. This file mounts them,
//! starts the app, and holds the presenter's tests: step 03's check is `cargo test`, so these
//! tests are what the generated presenter must pass before it is recorded. `names.rs` is
//! written by hand, and the generated presenter uses it.

mod names;

mod generated {
    include!(concat!(env!("OUT_DIR"), "/promptgen.rs"));
}

fn main() -> std::io::Result<()> {
    generated::app::run()
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::generated::presenter::{Presenter, greeting_for};
    use super::generated::view::View;
    use super::generated::view_impl::TerminalView;

    /// A view that answers with a fixed name and remembers what it was asked to show.
    struct FakeView {
        name: std::io::Result<String>,
        shown: Vec<String>,
    }

    impl View for &mut FakeView {
        fn ask_name(&mut self) -> std::io::Result<String> {
            match &self.name {
                Ok(name) => Ok(name.clone()),
                Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
            }
        }

        fn show_greeting(&mut self, greeting: &str) -> std::io::Result<()> {
            self.shown.push(greeting.to_string());
            Ok(())
        }
    }

    fn greet(name: std::io::Result<String>) -> (std::io::Result<()>, Vec<String>) {
        let mut view = FakeView { name, shown: Vec::new() };
        let result = Presenter::new(&mut view).run();
        (result, view.shown)
    }

    #[test]
    fn the_presenter_greets_the_name_the_view_gives() {
        let (result, shown) = greet(Ok("  Ada ".into()));
        result.unwrap();
        assert_eq!(shown, ["Hello, Ada!"]);
    }

    #[test]
    fn the_name_is_tidied_by_the_crates_own_rule() {
        assert_eq!(greeting_for(" Ada \t  Lovelace\n"), "Hello, Ada Lovelace!");
    }

    #[test]
    fn an_empty_name_is_greeted_as_a_stranger() {
        assert_eq!(greet(Ok("   ".into())).1, ["Hello, stranger!"]);
        assert_eq!(greeting_for(""), "Hello, stranger!");
    }

    #[test]
    fn view_errors_reach_the_caller_and_nothing_is_shown() {
        let (result, shown) = greet(Err(std::io::Error::other("terminal gone")));
        assert_eq!(result.unwrap_err().to_string(), "terminal gone");
        assert!(shown.is_empty());
    }

    #[test]
    fn the_terminal_view_asks_reads_one_line_and_greets() {
        let mut output = Vec::new();
        {
            let mut view = TerminalView::new(Cursor::new("Grace\r\nHopper\n"), &mut output);
            assert_eq!(view.ask_name().unwrap(), "Grace");
            view.show_greeting("Hello, Grace!").unwrap();
        }
        assert_eq!(String::from_utf8(output).unwrap(), "What is your name? Hello, Grace!\n");
    }

    #[test]
    fn the_terminal_view_reads_an_empty_name_at_end_of_input() {
        let mut view = TerminalView::new(Cursor::new(""), Vec::new());
        assert_eq!(view.ask_name().unwrap(), "");
    }
}

use super::view::View;

/// Runs the greeting exchange through a [`View`] it is given.
pub struct Presenter<V: View> {
    view: V,
}

impl<V: View> Presenter<V> {
    /// A presenter that talks to the user through `view`.
    pub fn new(view: V) -> Self {
        Presenter { view }
    }

    /// Asks for the user's name once and greets them by it.
    ///
    /// Errors from the view are returned unchanged.
    pub fn run(&mut self) -> std::io::Result<()> {
        let name = self.view.ask_name()?;
        self.view.show_greeting(&greeting_for(&name))
    }
}

/// The greeting for `name`: `Hello, <name>!` with the name tidied by
/// [`crate::names::tidy_name`], or `Hello, stranger!` when no name is left.
pub fn greeting_for(name: &str) -> String {
    match crate::names::tidy_name(name) {
        Some(name) => format!("Hello, {name}!"),
        None => "Hello, stranger!".to_string(),
    }
}

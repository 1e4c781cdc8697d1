/// Runs the greeting application on the terminal.
///
/// An error reading the name or writing the greeting is returned as the view gave it.
pub fn run() -> std::io::Result<()> {
    let view = super::view_impl::TerminalView::stdio();
    super::presenter::Presenter::new(view).run()
}

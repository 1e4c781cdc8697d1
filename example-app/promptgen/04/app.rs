/// Runs the greeting application on the terminal.
pub fn run() -> std::io::Result<()> {
    let view = super::view_impl::TerminalView::stdio();
    super::presenter::Presenter::new(view).run()
}

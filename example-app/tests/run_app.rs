//! The built app, run as a user runs it, with its input piped.

use std::io::Write;
use std::process::{Command, Stdio};

fn run_with_input(input: &str) -> String {
    let mut child =
        Command::new(env!("CARGO_BIN_EXE_example-app")).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn it_asks_for_a_name_and_greets_it() {
    assert_eq!(run_with_input("Ada\n"), "What is your name? Hello, Ada!\n");
}

#[test]
fn closed_input_gets_a_greeting_for_a_stranger() {
    assert_eq!(run_with_input(""), "What is your name? Hello, stranger!\n");
}

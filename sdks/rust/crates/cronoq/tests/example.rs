//! The README's library-mode program, `examples/library.rs`: it must appear in the README as it
//! is, and it runs both executor forms to completion.

use std::process::Command;

#[test]
fn the_readme_program_runs_both_executor_forms() {
    let source = include_str!("../examples/library.rs");
    assert!(
        include_str!("../../../README.md").contains(source),
        "README.md must show crates/cronoq/examples/library.rs as it is"
    );
    let exe = std::env::current_exe().unwrap();
    let example = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join("library");
    assert!(
        example.exists(),
        "{} is built by `cargo test`",
        example.display()
    );
    let out = Command::new(example).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "job: HELLO\n\
         request: 200 example.com is up\n\
         request: task ended as failed: GET /nope (attempt 1): 404\n"
    );
}

use std::process::Command;

pub fn medea() -> Command {
    Command::new(env!("CARGO_BIN_EXE_medea"))
}

#[test]
fn completions_are_generated_for_bash() {
    let out = medea().args(["completions", "bash"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("_medea()"), "{text}");
}

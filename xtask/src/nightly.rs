//! The nightly toolchain's optional components (`rust-src` for the sanitizers' `-Zbuild-std`,
//! `miri`): used where installed, added where they can be, and otherwise a clear reason why not.

use std::process::Command;

/// Makes sure nightly's `component` is installed: true if it already was or `rustup component
/// add` added it; otherwise the reason it is not there (no rustup, no nightly, no network...).
pub fn ensure_component(component: &str) -> Result<(), String> {
    let installed = Command::new("rustup")
        .args(["component", "list", "--toolchain", "nightly", "--installed"])
        .output()
        .map_err(|e| format!("rustup: {e}"))?;
    if !installed.status.success() {
        return Err(
            "no nightly toolchain (rustup component list --toolchain nightly failed)".into(),
        );
    }
    if String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|l| l.starts_with(component))
    {
        return Ok(());
    }
    // Its output captured: a component that cannot be had is a skip with a reason, not
    // rustup's error and backtrace in a passing log. Its first line is the reason.
    let added = Command::new("rustup")
        .args(["component", "add", component, "--toolchain", "nightly"])
        .output()
        .map_err(|e| format!("rustup: {e}"))?;
    if added.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&added.stderr);
    let said = stderr.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    Err(format!(
        "nightly's {component} is not installed and `rustup component add {component} \
         --toolchain nightly` failed: {}",
        said.trim().trim_start_matches("error: ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A component that cannot be added is an error carrying rustup's reason (its output is
    /// captured, so a passing test log holds no rustup error or backtrace).
    #[test]
    fn a_component_that_cannot_be_added_is_an_error_with_rustups_reason() {
        let why = ensure_component("no-such-component").unwrap_err();
        let has_nightly = Command::new("rustup")
            .args(["component", "list", "--toolchain", "nightly", "--installed"])
            .output()
            .is_ok_and(|out| out.status.success());
        if has_nightly {
            assert!(
                why.contains("failed: ") && why.contains("no-such-component"),
                "{why}"
            );
            assert!(!why.contains("backtrace"), "{why}");
        }
    }
}

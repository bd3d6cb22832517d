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
    let added = Command::new("rustup")
        .args(["component", "add", component, "--toolchain", "nightly"])
        .status()
        .map_err(|e| format!("rustup: {e}"))?;
    if added.success() {
        Ok(())
    } else {
        Err(format!(
            "nightly's {component} is not installed and `rustup component add {component} \
             --toolchain nightly` failed"
        ))
    }
}

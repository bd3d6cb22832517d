//! README.md's Commands list as the tests read it, one parser for xtask's unit and CLI tests.

use std::path::Path;

/// Each `- \`cargo xtask NAME ...\`` item of README.md's Commands section: its name and the
/// `--flags` its synopsis names.
pub fn commands(root: &Path) -> Vec<(String, Vec<String>)> {
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let (_, list) = readme
        .split_once("\n## Commands\n")
        .expect("a Commands section");
    let list = list.split("\n## ").next().unwrap();
    list.lines()
        .filter_map(|line| line.strip_prefix("- `cargo xtask "))
        .map(|item| {
            let synopsis = item.split('`').next().unwrap();
            let mut words = synopsis.split(|c: char| c.is_whitespace() || "[]|".contains(c));
            let name = words.next().unwrap().to_string();
            let flags = words.filter(|w| w.starts_with("--") && w.len() > 2);
            (name, flags.map(String::from).collect())
        })
        .collect()
}

//! Nothing here but a check of README's embedding docs: the examples are the `[[example]]`
//! targets beside this folder.

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// README gives one `cargo doc` command for the crates a runtime embeds: the ones these
    /// examples use, the loader and its ABI, and the GPU plugins, each a package of the
    /// workspace.
    #[test]
    fn readme_has_one_cargo_doc_command_for_the_embedding_crates() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        let commands: Vec<&str> = readme
            .lines()
            .filter(|line| line.starts_with("cargo doc --no-deps -p "))
            .collect();
        assert_eq!(commands.len(), 1, "{commands:?}");
        let named: Vec<&str> = commands[0]
            .split(" -p ")
            .skip(1)
            .map(|arg| arg.split_whitespace().next().unwrap())
            .collect();
        // (package, folder): rpc-core's package has its own name on crates.io.
        for (crate_name, folder) in [
            ("gpu-rpc-core", "rpc-core"),
            ("plugin-host", "plugin-host"),
            ("plugin-cuda", "plugin-cuda"),
            ("plugin-amdgpu", "plugin-amdgpu"),
            ("plugin-abi", "plugin-abi"),
            ("plugin-loader", "plugin-loader"),
        ] {
            assert!(named.contains(&crate_name), "{crate_name} in {named:?}");
            let manifest = std::fs::read_to_string(root.join(folder).join("Cargo.toml"))
                .unwrap_or_else(|e| panic!("{crate_name}: {e}"));
            assert!(
                manifest.contains(&format!("name = \"{crate_name}\"")),
                "{crate_name}"
            );
        }
    }
}

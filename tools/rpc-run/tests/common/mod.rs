//! Helpers shared by rpc-run's integration tests (`cli.rs`, `inspect_nvidia.rs`).

use std::path::{Path, PathBuf};

/// The images `cargo xtask gpu-images` built (LLVM 22's GPU libc tests) for `target`
/// (`nvptx64`), or for every target; none, with a note saying so, where it has not run here.
pub fn built_gpu_images(target: Option<&str>) -> Vec<PathBuf> {
    let mut root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/gpu-images");
    if let Some(target) = target {
        root.push(target);
    }
    let Ok(entries) = std::fs::read_dir(&root) else {
        eprintln!(
            "no {} (run `cargo xtask gpu-images`): no images to read",
            root.display()
        );
        return Vec::new();
    };
    let folders: Vec<PathBuf> = match target {
        Some(_) => vec![root],
        None => entries.flatten().map(|e| e.path()).collect(),
    };
    let mut images = Vec::new();
    for folder in folders {
        for image in std::fs::read_dir(&folder).unwrap().flatten() {
            let path = image.path();
            // The build's logs beside the images.
            if path.extension().is_none() {
                images.push(path);
            }
        }
    }
    images
}

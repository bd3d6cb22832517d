//! The commands about plugins and the main job:
//! - `demo [--plugin host|cuda|amdgpu] [--image FILE --kernel NAME]` runs `rpc-demo`;
//! - `devices` prints one line per plugin: `NAME: K devices (...)`;
//! - `build --plugin host|cuda|amdgpu|all [--release]` builds the binaries that embed them.

use std::process::Command;

use crate::flags::Flags;
use crate::{cargo, project_root, Failure, Result};

const PLUGINS: [&str; 3] = ["host", "cuda", "amdgpu"];

fn status(command: &mut Command, what: &str) -> Result {
    let status = command
        .current_dir(project_root())
        .status()
        .map_err(|e| Failure::Failed(format!("{what}: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(Failure::Failed(format!("{what} failed ({status})")))
    }
}

/// `cargo xtask demo`: the README's main command.
pub fn demo(args: &[String]) -> Result {
    let flags = Flags::parse("demo", args, &["plugin", "image", "kernel"])?;
    let plugin = flags.get("plugin").unwrap_or("host");
    if !PLUGINS.contains(&plugin) {
        return Err(Failure::Usage(format!(
            "demo: --plugin is host, cuda or amdgpu, not `{plugin}`"
        )));
    }
    let mut command = Command::new(cargo());
    command.args([
        "run", "--quiet", "-p", "demo", "--bin", "rpc-demo", "--", "--plugin", plugin,
    ]);
    for name in ["image", "kernel"] {
        if let Some(value) = flags.get(name) {
            command.args([format!("--{name}"), value.to_string()]);
        }
    }
    status(&mut command, &format!("the {plugin} demo"))
}

/// `cargo xtask devices`.
pub fn devices(args: &[String]) -> Result {
    Flags::parse("devices", args, &[])?;
    println!(
        "{}",
        plugin_host::describe(plugin_host::HostConfig::default())
    );
    println!("{}", plugin_cuda::describe());
    println!("{}", plugin_amdgpu::describe());
    Ok(())
}

/// `cargo xtask build`: the plugin crates are features of the binary that embeds them
/// (`rpc-demo`); the host plugin also brings `rpc-serve`.
pub fn build(args: &[String]) -> Result {
    let release = args.iter().any(|a| a == "--release");
    let rest: Vec<String> = args.iter().filter(|a| *a != "--release").cloned().collect();
    let flags = Flags::parse("build", &rest, &["plugin"])?;
    let chosen: Vec<&str> = match flags.required("plugin")? {
        "all" => PLUGINS.to_vec(),
        one if PLUGINS.contains(&one) => vec![one],
        other => {
            return Err(Failure::Usage(format!(
                "build: --plugin is host, cuda, amdgpu or all, not `{other}`"
            )));
        }
    };
    let profile = if release { "release" } else { "debug" };
    let with_profile = |command: &mut Command| {
        if release {
            command.arg("--release");
        }
    };
    let mut demo = Command::new(cargo());
    demo.args([
        "build",
        "-p",
        "demo",
        "--bin",
        "rpc-demo",
        "--no-default-features",
    ]);
    demo.args(["--features", &chosen.join(",")]);
    with_profile(&mut demo);
    status(&mut demo, "cargo build (rpc-demo)")?;
    if chosen.contains(&"host") {
        let mut serve = Command::new(cargo());
        serve.args(["build", "-p", "rpc-serve"]);
        with_profile(&mut serve);
        status(&mut serve, "cargo build (rpc-serve)")?;
    }
    let dir = project_root().join("target").join(profile);
    println!(
        "built {} (plugins: {})",
        dir.join("rpc-demo").display(),
        chosen.join(", ")
    );
    if chosen.contains(&"host") {
        println!("built {}", dir.join("rpc-serve").display());
    }
    Ok(())
}

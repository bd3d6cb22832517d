//! The commands about plugins and the main job:
//! - `demo [--plugin host|cuda|amdgpu] [--image FILE --kernel NAME]` runs `rpc-demo`;
//! - `build --plugin host|cuda|amdgpu|all [--release]` builds the binaries that embed them,
//!   and each plugin's loadable library (`libplugin_NAME.so`, crate `plugin-so/NAME`).

use std::process::Command;

use crate::{cargo, project_root, succeed, Failure, Result};

const PLUGINS: [&str; 3] = ["host", "cuda", "amdgpu"];

/// `cargo xtask demo`'s flags, rpc-demo's own.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// The plugin: host (CPU warps), or cuda or amdgpu (run --image on the first GPU)
    #[arg(long, value_name = "PLUGIN", default_value = "host", value_parser = PLUGINS)]
    plugin: String,
    /// A device image to run (cuda and amdgpu)
    #[arg(long, value_name = "FILE")]
    image: Option<String>,
    /// The kernel of --image to run [default: main]
    #[arg(long, value_name = "NAME", requires = "image")]
    kernel: Option<String>,
    /// The server's statistics as one line of JSON
    #[arg(long)]
    json: bool,
}

/// `cargo xtask build`'s flags.
#[derive(clap::Args, Debug)]
pub struct BuildArgs {
    /// The plugins to build in
    #[arg(long, value_name = "PLUGIN", value_parser = ["host", "cuda", "amdgpu", "all"])]
    plugin: String,
    /// A release build
    #[arg(long)]
    release: bool,
}

fn status(command: &mut Command, what: &str) -> Result {
    Ok(succeed(command.current_dir(project_root()), what)?)
}

/// `cargo xtask demo`: the README's main command.
pub fn demo(args: &DemoArgs) -> Result {
    let plugin = args.plugin.as_str();
    if plugin == "host" && args.image.is_some() {
        return Err(Failure::Usage(
            "demo: --image and --kernel are for the cuda and amdgpu plugins (the host demo \
             runs its own kernels)"
                .into(),
        ));
    }
    // Not `--quiet`: the first run builds for a while, and cargo's progress says so.
    let mut command = Command::new(cargo());
    command.args([
        "run", "-p", "demo", "--bin", "rpc-demo", "--", "--plugin", plugin,
    ]);
    for (flag, value) in [("--image", &args.image), ("--kernel", &args.kernel)] {
        if let Some(value) = value {
            command.args([flag, value]);
        }
    }
    if args.json {
        command.arg("--json");
    }
    status(&mut command, &format!("the {plugin} demo"))
}

/// `cargo xtask build`: the plugin crates are features of the binary that embeds them
/// (`rpc-demo`); the host plugin also brings `rpc-serve`; each plugin's library
/// (`libplugin_NAME.so`) lands beside the binaries.
pub fn build(args: &BuildArgs) -> Result {
    let release = args.release;
    let chosen: Vec<&str> = match args.plugin.as_str() {
        "all" => PLUGINS.to_vec(),
        one => vec![one],
    };
    let profile = if release { "release" } else { "debug" };
    // A binary with fewer plugins goes to a target folder of its own, so it never replaces
    // the `rpc-demo` with every plugin that `cargo xtask demo` builds.
    let target = if chosen == PLUGINS {
        project_root().join("target")
    } else {
        project_root().join("target/plugins").join(chosen.join("-"))
    };
    let cargo_build = |package: &str, binary: Option<&str>| {
        let mut command = Command::new(cargo());
        command.args(["build", "-p", package]);
        if let Some(binary) = binary {
            command.args(["--bin", binary]);
        }
        command.arg("--target-dir").arg(&target);
        if release {
            command.arg("--release");
        }
        command
    };
    let mut demo = cargo_build("demo", Some("rpc-demo"));
    demo.args(["--no-default-features", "--features", &chosen.join(",")]);
    status(&mut demo, "cargo build (rpc-demo)")?;
    let dir = target.join(profile);
    println!(
        "built {} (plugins: {})",
        dir.join("rpc-demo").display(),
        chosen.join(", ")
    );
    if chosen.contains(&"host") {
        status(
            &mut cargo_build("rpc-serve", Some("rpc-serve")),
            "cargo build (rpc-serve)",
        )?;
        println!("built {}", dir.join("rpc-serve").display());
    }
    for plugin in &chosen {
        let package = format!("plugin-{plugin}-so");
        status(
            &mut cargo_build(&package, None),
            &format!("cargo build ({package})"),
        )?;
        println!(
            "built {}",
            dir.join(format!("libplugin_{plugin}.so")).display()
        );
    }
    Ok(())
}

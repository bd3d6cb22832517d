//! `cargo xtask tidy`: the rules of ARCHITECTURE.md that a reader of the sources can check, run
//! first by `cargo xtask test`. It fails, naming each offending file, on:
//! - an atomic named outside rpc-core's one sync shim (`sync::atomic` in any other file of
//!   `rpc-core/src`);
//! - a `thread_local!` in rpc-core's protocol layer (`rpc-core/src/protocol/`): what a thread
//!   keeps for the server (its executor's context, its batch of deferred flips) is the server's,
//!   reached through the protocol's `Wait`;
//! - a vendor name (CUDA, HSA, AMD GPU, NVIDIA) or `libloading` in rpc-core's code or manifest
//!   (comments may name the vendors, the code may not; `cudarc` contains `cuda`);
//! - a plugin crate missing one of the files every plugin has (STYLE 2), or its loadable
//!   library's crate (`plugin-so/NAME`);
//! - a `.rs` file that does not start with a `//!` line;
//! - `include/rpc_plugin.h` not what `cargo xtask header` generates from plugin-abi;
//! - a circle between rpc-core's layers (`protocol`, `server`, `services`, `plugin`: each may
//!   use only the ones below it, see `rpc-core/src/lib.rs`), or between the files of one layer.
//!   A file may use the module that holds it (a layer's `mod.rs` is its front), and the error
//!   enum the types its variants carry, so the circles looked for are between siblings and
//!   across layers; but a file of [`STANDS_ALONE`] and its holder count like siblings (the
//!   holder may use it, it may not use the holder).
//! - a circle between the files of a plugin crate ([`PLUGINS`]), by the same rules;
//! - a file of rpc-core's protocol, server or services layer naming the root's `Result`,
//!   `Error` or `VendorError` ([`ROOT_ERRORS`]): each layer fails with its own error, and only
//!   the root and the plugin layer (which returns the embedder's `Error`) name the root's;
//! - rpc-core's root re-exports (the `pub use` items of its `lib.rs`, and its exported macros
//!   but the hidden ones, [`HIDDEN_AT_ROOT`]) not the capitalised names in backquotes of
//!   ARCHITECTURE.md's "Front door" paragraph.
//!
//! The checks read the text of the files, no compiler: a path is a `crate::...` or `super::...`
//! in a line that is not a comment.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use crate::{project_root, Failure, Result};

/// The files every plugin crate has, under its `src/` (STYLE 2).
const PLUGIN_FILES: &[&str] = &[
    "lib.rs",
    "device.rs",
    "memory.rs",
    "image.rs",
    "loader.rs",
    "error.rs",
];
const PLUGINS: &[&str] = &["plugin-host", "plugin-cuda", "plugin-amdgpu"];
/// What rpc-core's code must not name (lowercase; found anywhere in lowercased code).
const VENDOR_WORDS: &[&str] = &["cuda", "hsa", "amdgpu", "nvidia", "libloading"];
/// rpc-core's layers, lowest first: each may use only the ones before it (and the shared
/// `error` and `sync`, which use none of them).
const LAYERS: &[&str] = &["protocol", "server", "services", "plugin"];
/// Modules that must not use the module holding them, so the arrow between the two goes one
/// way (a circle with the holder is reported like one between siblings): the worker's state
/// machine stands below the server it runs, so that its no-lost-wake-up argument reads in one
/// file (`server/thread.rs`).
const STANDS_ALONE: &[&str] = &["server::thread"];
/// The root's error types, which no layer below the plugin layer names.
const ROOT_ERRORS: &[&str] = &["Result", "Error", "VendorError"];
/// The layers that name no type of the root (below the plugin layer).
const OWN_ERROR_LAYERS: &[&str] = &["protocol", "server", "services"];
/// Names at rpc-core's root that its front door does not list: `#[doc(hidden)]` macros for
/// the workspace's own crates (plugin-abi's conversions of the statistics).
const HIDDEN_AT_ROOT: &[&str] = &["stats_counters"];
/// How ARCHITECTURE.md's paragraph listing the root's names begins.
const FRONT_DOOR: &str = "**Front door.**";

pub fn run() -> Result {
    let mut problems = check(&project_root());
    problems.extend(crate::header::stale(&project_root()));
    if problems.is_empty() {
        println!("tidy: ok");
        return Ok(());
    }
    for problem in &problems {
        eprintln!("tidy: {problem}");
    }
    Err(Failure::Failed(format!(
        "tidy: {} problem(s)",
        problems.len()
    )))
}

/// Every rule broken under `root`, one line each.
fn check(root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let core = root.join("rpc-core/src");
    let core_files = rust_files(&core);
    for file in &core_files {
        let text = read(file);
        let relative = file
            .strip_prefix(root)
            .unwrap_or(file)
            .display()
            .to_string();
        if file != &core.join("sync.rs") {
            for line in code_lines(&text) {
                if line.contains("sync::atomic") {
                    problems.push(format!(
                        "{relative}: names `sync::atomic` (atomics come from crate::sync)"
                    ));
                    break;
                }
            }
        }
        if file.starts_with(core.join("protocol")) && declares_thread_local(&text) {
            problems.push(format!(
                "{relative}: declares a `thread_local!` (the protocol layer keeps no per-thread \
                 state: a server thread's is the server's, reached through `Wait`)"
            ));
        }
        if OWN_ERROR_LAYERS
            .iter()
            .any(|layer| file.starts_with(core.join(layer)))
        {
            if let Some(name) = root_error_named(&text) {
                problems.push(format!(
                    "{relative}: names the root's `crate::{name}` (each layer fails with its own \
                     error: ProtocolError, ServerError)"
                ));
            }
        }
        if let Some(word) = vendor_word(code_lines(&text)) {
            problems.push(format!(
                "{relative}: names the vendor word `{word}` in code"
            ));
        }
    }
    let manifest = read(&root.join("rpc-core/Cargo.toml"));
    if let Some(word) = vendor_word(manifest.lines().filter(|l| !l.trim().starts_with('#'))) {
        problems.push(format!("rpc-core/Cargo.toml: names `{word}`"));
    }
    for plugin in PLUGINS {
        for file in PLUGIN_FILES {
            if !root.join(plugin).join("src").join(file).is_file() {
                problems.push(format!(
                    "{plugin}: has no src/{file} (every plugin has one)"
                ));
            }
        }
        let library = plugin.replace("plugin-", "plugin-so/");
        if !root.join(&library).join("src/lib.rs").is_file() {
            problems.push(format!(
                "{plugin}: has no {library}/src/lib.rs (every plugin has its loadable library)"
            ));
        }
    }
    for file in rust_files(root) {
        if !read(&file).starts_with("//!") {
            let relative = file.strip_prefix(root).unwrap_or(&file).display();
            problems.push(format!("{relative}: does not start with a `//!` line"));
        }
    }
    problems.extend(front_door(root, &core_files));
    problems.extend(circles("rpc-core", &core, &core_files));
    for plugin in PLUGINS {
        let src = root.join(plugin).join("src");
        problems.extend(circles(plugin, &src, &rust_files(&src)));
    }
    problems
}

/// The lines of `text` that are not comments, cut at a `//` comment.
fn code_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .map(|line| line.split(" //").next().unwrap_or(line))
}

/// The first vendor word in `lines`, anywhere in a name (`CudaDevice` counts).
fn vendor_word<'a>(lines: impl Iterator<Item = &'a str>) -> Option<&'static str> {
    for line in lines {
        let lower = line.to_lowercase();
        if let Some(word) = VENDOR_WORDS.iter().find(|word| lower.contains(*word)) {
            return Some(word);
        }
    }
    None
}

/// Whether the code of `text` (not its comments) declares a thread-local, std's or loom's.
fn declares_thread_local(text: &str) -> bool {
    code_lines(text).any(|line| line.contains("thread_local!"))
}

/// The first of the root's error types ([`ROOT_ERRORS`]) that the code of `text` names as
/// `crate::NAME` or in a `crate::{...}` group, which may span lines.
fn root_error_named(text: &str) -> Option<&'static str> {
    let code = code_lines(text).collect::<Vec<_>>().join(" ");
    for (at, _) in code.match_indices("crate::") {
        if code[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        // `paths_after` reads a group after a prefix: give it the `crate` prefix back.
        for path in paths_after(&code[at..]) {
            if let [_, name] = &path[..] {
                if let Some(found) = ROOT_ERRORS.iter().find(|e| **e == name.as_str()) {
                    return Some(found);
                }
            }
        }
    }
    None
}

/// Where rpc-core's root names (its `pub use` items and exported macros) and ARCHITECTURE.md's
/// front-door list differ, one line per name.
fn front_door(root: &Path, core_files: &[PathBuf]) -> Vec<String> {
    let mut at_root = root_reexports(&read(&root.join("rpc-core/src/lib.rs")));
    for file in core_files {
        at_root.extend(exported_macros(&read(file)));
    }
    at_root.retain(|name| !HIDDEN_AT_ROOT.contains(&name.as_str()));
    let Some(listed) = front_door_names(&read(&root.join("ARCHITECTURE.md"))) else {
        return vec![format!(
            "ARCHITECTURE.md: has no paragraph beginning `{FRONT_DOOR}`"
        )];
    };
    let mut problems = Vec::new();
    for name in at_root.difference(&listed) {
        problems.push(format!(
            "rpc-core/src/lib.rs: re-exports `{name}`, which ARCHITECTURE.md's front door does \
             not list"
        ));
    }
    for name in listed.difference(&at_root) {
        problems.push(format!(
            "ARCHITECTURE.md: its front door lists `{name}`, which rpc-core's root does not \
             re-export"
        ));
    }
    problems
}

/// The names the `pub use` items of `text` (a `lib.rs`) bring in: each item's last segment,
/// or what it is renamed `as`.
fn root_reexports(text: &str) -> BTreeSet<String> {
    let code = code_lines(text).collect::<Vec<_>>().join(" ");
    let mut names = BTreeSet::new();
    for (at, _) in code.match_indices("pub use ") {
        let item = code[at + "pub use ".len()..]
            .split(';')
            .next()
            .unwrap_or("");
        // `a::{b::C, D as E}` lists `C` and `E`; `a::B` lists `B`.
        let inner = match item.find('{') {
            Some(open) => item[open + 1..].trim_end().trim_end_matches('}'),
            None => item,
        };
        for part in inner.split(',') {
            let last = part.split_whitespace().last().unwrap_or("");
            let name = last.rsplit("::").next().unwrap_or("");
            if !name.is_empty() && name.chars().all(is_ident) {
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// The macros `text` exports at the crate's root (`#[macro_export]`, then `macro_rules! NAME`).
fn exported_macros(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut exported = false;
    for line in code_lines(text) {
        let line = line.trim();
        if line.starts_with("#[macro_export]") {
            exported = true;
        } else if let Some(rest) = line.strip_prefix("macro_rules!") {
            if exported {
                names.push(rest.trim().chars().take_while(|&c| is_ident(c)).collect());
            }
            exported = false;
        } else if !line.starts_with("#[") {
            exported = false;
        }
    }
    names
}

/// The capitalised names in backquotes (`Name`, `NAME`, no path) of the paragraph of `text`
/// that begins with [`FRONT_DOOR`], if there is one.
fn front_door_names(text: &str) -> Option<BTreeSet<String>> {
    let start = text.find(FRONT_DOOR)?;
    let paragraph = text[start..].split("\n\n").next().unwrap_or("");
    Some(
        paragraph
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|quoted| {
                quoted.starts_with(|c: char| c.is_ascii_uppercase()) && quoted.chars().all(is_ident)
            })
            .map(String::from)
            .collect(),
    )
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The circles between the layers of crate `name` (rpc-core's; a plugin has none) and between
/// the sibling files of each layer, its sources being `files` under `src`.
fn circles(name: &str, src: &Path, files: &[PathBuf]) -> Vec<String> {
    let modules: BTreeMap<Vec<String>, &PathBuf> =
        files.iter().map(|f| (module_of(src, f), f)).collect();
    let known: BTreeSet<Vec<String>> = modules.keys().cloned().collect();
    let mut layer_edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut file_edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, file) in &modules {
        for used in uses(module, &read(file), &known) {
            let (from, to) = (layer_of(module), layer_of(&used));
            if let (Some(from), Some(to)) = (from, to) {
                if from != to {
                    layer_edges.entry(from).or_default().insert(to);
                }
            }
            if counts_for_circles(module, &used) {
                file_edges.entry(module.clone()).or_default().insert(used);
            }
        }
    }
    let mut problems = Vec::new();
    for (from, tos) in &layer_edges {
        let rank = |layer: &str| LAYERS.iter().position(|l| *l == layer);
        for to in tos {
            if rank(to) > rank(from) {
                problems.push(format!(
                    "{name}: layer `{from}` uses `{to}`, a layer above it"
                ));
            }
        }
    }
    for circle in find_circles(&file_edges) {
        let names: Vec<String> = circle.iter().map(|m| m.join("::")).collect();
        problems.push(format!(
            "{name}: modules in a circle: {}",
            names.join(" -> ")
        ));
    }
    problems
}

/// Whether `from` using `to` is an edge circles are looked for along. A module may use the
/// modules that hold it (and they it), unless one of the two stands alone ([`STANDS_ALONE`]);
/// a circle is between siblings. The error enum may name the types its variants carry (every
/// module returns errors).
fn counts_for_circles(from: &[String], to: &[String]) -> bool {
    let alone = |m: &[String]| STANDS_ALONE.contains(&m.join("::").as_str());
    let related = from.starts_with(to) || to.starts_with(from);
    let is_error = from.last().is_some_and(|m| m == "error");
    !is_error && (!related || alone(from) || alone(to))
}

/// The layer a module belongs to, if it is in one (`error`, `sync` and the root are not).
fn layer_of(module: &[String]) -> Option<String> {
    module
        .first()
        .filter(|first| LAYERS.contains(&first.as_str()))
        .cloned()
}

/// The module a file of `src` defines: `server/thread.rs` -> `[server, thread]`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The modules `text` (the code of `module`) names, each resolved to the longest known module.
fn uses(module: &[String], text: &str, known: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let mut found = BTreeSet::new();
    for line in code_lines(text) {
        for (word, base) in [("crate::", &module[..0]), ("super::", parent(module))] {
            for (at, _) in line.match_indices(word) {
                if line[..at].chars().next_back().is_some_and(is_ident) {
                    continue;
                }
                for path in paths_after(&line[at + word.len()..]) {
                    let mut full = base.to_vec();
                    full.extend(path);
                    while !full.is_empty() && !known.contains(&full) {
                        full.pop();
                    }
                    if !full.is_empty() && full != module {
                        found.insert(full);
                    }
                }
            }
        }
    }
    found
}

/// The module holding `module` (`super` in its files).
fn parent(module: &[String]) -> &[String] {
    &module[..module.len().saturating_sub(1)]
}

/// The module paths a `use` or path names after `crate::`: `a::b::C` gives `[a, b]`,
/// `a::{b::C, D}` gives `[a, b]` and `[a]`.
fn paths_after(rest: &str) -> Vec<Vec<String>> {
    let mut prefix = Vec::new();
    let mut chars = rest;
    loop {
        let ident: String = chars.chars().take_while(|&c| is_ident(c)).collect();
        if ident.is_empty() {
            break;
        }
        chars = &chars[ident.len()..];
        if let Some(after) = chars.strip_prefix("::") {
            prefix.push(ident);
            chars = after;
            if let Some(group) = chars.strip_prefix('{') {
                let inner = group.split('}').next().unwrap_or("");
                return inner
                    .split(',')
                    .map(|item| {
                        let mut path = prefix.clone();
                        path.extend(
                            item.trim()
                                .split("::")
                                .filter(|s| s.chars().all(is_ident) && !s.is_empty())
                                .map(String::from),
                        );
                        path
                    })
                    .collect();
            }
        } else {
            prefix.push(ident);
            break;
        }
    }
    vec![prefix]
}

/// Each circle of `edges`, once (as found by a depth-first walk), as the modules along it.
fn find_circles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    let mut circles = Vec::new();
    let mut done = BTreeSet::new();
    for start in edges.keys() {
        let mut stack = vec![start.clone()];
        walk(edges, &mut stack, &mut done, &mut circles);
    }
    circles
}

fn walk(
    edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
    stack: &mut Vec<Vec<String>>,
    done: &mut BTreeSet<Vec<String>>,
    circles: &mut Vec<Vec<Vec<String>>>,
) {
    let here = stack.last().expect("never empty").clone();
    if done.contains(&here) {
        return;
    }
    for next in edges.get(&here).into_iter().flatten() {
        if let Some(at) = stack.iter().position(|m| m == next) {
            let mut circle = stack[at..].to_vec();
            circle.push(next.clone());
            circles.push(circle);
        } else {
            stack.push(next.clone());
            walk(edges, stack, done, circles);
            stack.pop();
        }
    }
    done.insert(here);
}

/// Every `.rs` file under `dir`, sorted, but in build outputs (`target`) and hidden folders.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() {
                if name != "target" && !name.to_string_lossy().starts_with('.') {
                    dirs.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_after_reads_plain_paths_and_groups() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            paths_after("server::thread::Started;"),
            [s(&["server", "thread", "Started"])]
        );
        assert_eq!(
            paths_after("server::{thread::Started, Inner};"),
            [s(&["server", "thread", "Started"]), s(&["server", "Inner"])]
        );
    }

    #[test]
    fn a_circle_between_two_modules_is_found_once() {
        let m = |s: &str| vec![s.to_string()];
        let mut edges = BTreeMap::new();
        edges.insert(m("a"), BTreeSet::from([m("b")]));
        edges.insert(m("b"), BTreeSet::from([m("a"), m("c")]));
        let circles = find_circles(&edges);
        assert_eq!(circles, [vec![m("a"), m("b"), m("a")]]);
    }

    #[test]
    fn a_module_may_use_its_holder_unless_it_stands_alone() {
        let m = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
        assert!(!counts_for_circles(&m("server::dispatch"), &m("server")));
        assert!(!counts_for_circles(&m("server"), &m("server::dispatch")));
        assert!(counts_for_circles(
            &m("server::dispatch"),
            &m("server::thread")
        ));
        // `server::thread` stands alone: both arrows to and from its holder count, so a
        // circle between the two is found.
        assert!(counts_for_circles(&m("server::thread"), &m("server")));
        assert!(counts_for_circles(&m("server"), &m("server::thread")));
        assert!(!counts_for_circles(
            &m("protocol::error"),
            &m("server::thread")
        ));
    }

    #[test]
    fn a_thread_local_is_found_in_code_only() {
        assert!(declares_thread_local(
            "std::thread_local! {\n    static X: u8 = 0;\n}\n"
        ));
        assert!(declares_thread_local("    loom::thread_local! {"));
        assert!(!declares_thread_local(
            "//! Not a `thread_local!` here.\nfn f() {} // nor thread_local! here\n"
        ));
    }

    #[test]
    fn a_root_error_is_found_in_paths_and_groups_in_code_only() {
        assert_eq!(root_error_named("use crate::Result;\n"), Some("Result"));
        assert_eq!(
            root_error_named("use crate::{\n    Opcode,\n    VendorError,\n};\n"),
            Some("VendorError")
        );
        assert_eq!(root_error_named("fn f(e: crate::Error) {}"), Some("Error"));
        // The layers' own errors, a longer path, a comment and a foreign crate are not the root's.
        assert_eq!(
            root_error_named(
                "use crate::server::error::{ServerError, VendorError};\n\
                 /// [`Error`](crate::Error)\nuse my_crate::Result;\nuse crate::ResultSet;\n"
            ),
            None
        );
    }

    #[test]
    fn the_root_names_are_its_pub_use_items_and_exported_macros() {
        let lib =
            "pub mod plugin;\npub use error::{Error, Result};\n#[cfg(x)]\npub use server::{\n    \
                   a::MailboxId,\n    RpcServer as Server,\n};\npub use protocol::Opcode;\n\
                   // pub use gone::Commented;\npub(crate) use sync::Arc;\n";
        let names: Vec<_> = root_reexports(lib).into_iter().collect();
        assert_eq!(names, ["Error", "MailboxId", "Opcode", "Result", "Server"]);
        let stats =
            "#[doc(hidden)]\n#[macro_export]\nmacro_rules! counters {\n}\nmacro_rules! inner {}\n";
        assert_eq!(exported_macros(stats), ["counters"]);
    }

    #[test]
    fn the_front_door_lists_capitalised_plain_names_of_its_paragraph() {
        let doc = "# A\n\n**Front door.** `Runtime` (one `Vec`), `ABSENT_AFTER`, `RpcServer::register`,\n\
                   `protocol`, `#![warn(x)]`.\n\n**Errors.** `Other`.\n";
        let names: Vec<_> = front_door_names(doc).unwrap().into_iter().collect();
        assert_eq!(names, ["ABSENT_AFTER", "Runtime", "Vec"]);
        assert_eq!(front_door_names("no such paragraph"), None);
    }

    #[test]
    fn vendor_words_match_in_code_only() {
        assert_eq!(vendor_word(["let x = host_init();"].into_iter()), None);
        assert_eq!(
            vendor_word(["let d: CudaDevice;"].into_iter()),
            Some("cuda")
        );
        assert_eq!(
            vendor_word(["use libloading::Library;"].into_iter()),
            Some("libloading")
        );
        assert_eq!(vendor_word(["let p = \"cuda\";"].into_iter()), Some("cuda"));
        let text = "//! A CUDA note.\nfn f() {}\n";
        assert_eq!(vendor_word(code_lines(text)), None);
    }
}

//! Reading PTX text without a driver: the version and target, each `.entry` with the size of
//! its parameter block (what the packed launch arguments must fill), its own local frame
//! (`__local_depot`, the stack the kernel itself needs; callees add theirs, which only ptxas
//! knows) and whether it calls anything, and the `.global` and `.const` variables with their
//! sizes.

/// A kernel (`.entry`) of a PTX module.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    /// Bytes of the parameter block, each parameter at its alignment.
    pub params_size: u32,
    /// Each parameter's bytes, in order.
    pub params: Vec<u32>,
    /// Bytes of the kernel's own local frame (`.local ... __local_depotN[SIZE]`).
    pub frame: u32,
    /// Whether the body has a `call` (then callees' frames come on top of `frame`).
    pub calls: bool,
}

/// What a PTX module holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Module {
    /// `.version`, e.g. `7.8`.
    pub version: String,
    /// `.target`, e.g. `sm_90`.
    pub target: String,
    pub entries: Vec<Entry>,
    /// `.global` and `.const` variables (name, bytes).
    pub globals: Vec<(String, u64)>,
    /// Why the text is not a whole module, where it is not (a truncated file): no `.target`,
    /// an `.entry` or block left open, or a last statement without its end.
    pub unfinished: Option<String>,
}

/// Whether `bytes` look like PTX text: a `.version` directive near the start.
pub fn is_ptx(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(4096)];
    std::str::from_utf8(head)
        .map(|t| t.lines().any(|l| l.trim_start().starts_with(".version")))
        .unwrap_or(false)
}

/// Bytes of one element of a PTX type (`.u64`, `.b8`, `.f32`, `.pred`...).
fn type_size(token: &str) -> Option<u32> {
    let kind = token.strip_prefix('.')?;
    if kind == "pred" {
        return Some(1);
    }
    let bits: u32 = kind.get(1..)?.parse().ok()?;
    matches!(kind.as_bytes()[0], b'u' | b's' | b'b' | b'f').then_some(bits / 8)
}

/// A declaration's name and element count: `x`, `x[16]`, `x[2][3]`.
fn name_and_count(token: &str) -> (String, u64) {
    let token = token.trim_end_matches([';', ',']);
    match token.split_once('[') {
        None => (token.to_owned(), 1),
        Some((name, dims)) => {
            let count = dims
                .split('[')
                .map(|d| d.trim_end_matches(']').parse::<u64>().unwrap_or(0))
                .product();
            (name.to_owned(), count)
        }
    }
}

/// A declaration's element size, alignment and name with count, from its tokens after the
/// state space (`.align 8 .b8 name[552]`, `.u64 .ptr .align 1 name`).
fn declaration<'t>(tokens: impl Iterator<Item = &'t str>) -> Option<(u32, u32, String, u64)> {
    let mut tokens = tokens.peekable();
    let (mut size, mut align) = (None, None);
    while let Some(token) = tokens.next() {
        if token == ".ptr" {
            // `.ptr [.space] .align N` is the pointee's alignment, not the parameter's.
            while tokens
                .peek()
                .is_some_and(|t| t.starts_with('.') && *t != ".align")
            {
                tokens.next();
            }
            if tokens.peek() == Some(&".align") {
                tokens.next();
                tokens.next();
            }
        } else if token == ".align" {
            align = tokens.next().and_then(|a| a.parse().ok());
        } else if let Some(s) = type_size(token) {
            size = Some(s);
        } else if token.starts_with('.') {
            // .ptr, .global (in a param's pointer annotation), .visible ...
        } else {
            let size = size?;
            let (name, count) = name_and_count(token);
            return Some((size, align.unwrap_or(size).max(1), name, count));
        }
    }
    None
}

/// Reads a PTX module. Lines it does not understand are skipped: PTX is a big language, and
/// only the directives above are needed; but a module that does not end as one does is
/// [`Module::unfinished`].
pub fn read(text: &str) -> Module {
    let mut module = Module::default();
    // Comments out, so that braces and directives in them do not count.
    let text: String = text
        .lines()
        .map(|l| l.split_once("//").map_or(l, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n");
    let mut depth = 0usize;
    let mut current: Option<Entry> = None;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let trimmed = line.trim();
        let tokens: Vec<&str> = trimmed.split_whitespace().collect();
        if depth == 0 {
            match tokens.first().copied() {
                Some(".version") => module.version = tokens.get(1).unwrap_or(&"").to_string(),
                Some(".target") => {
                    module.target = tokens.get(1).unwrap_or(&"").trim_end_matches(',').into()
                }
                _ => {}
            }
            if let Some(at) = tokens.iter().position(|&t| t == ".entry") {
                // `.entry NAME(` then parameters up to `)`, possibly over many lines.
                let mut header = tokens[at + 1..].join(" ");
                while !header.contains(')') && !header.contains('{') {
                    match lines.next() {
                        Some(next) => {
                            header.push(' ');
                            header.push_str(next.trim());
                        }
                        None => break,
                    }
                }
                let name = header
                    .split(|c: char| c == '(' || c.is_whitespace())
                    .next()
                    .unwrap_or("")
                    .to_owned();
                let params = header
                    .split_once('(')
                    .and_then(|(_, rest)| rest.split_once(')'))
                    .map_or("", |(params, _)| params);
                let mut size = 0u32;
                let mut each = Vec::new();
                for param in params.split(',').filter(|p| p.contains(".param")) {
                    let tokens = param
                        .split_whitespace()
                        .skip_while(|&t| t != ".param")
                        .skip(1);
                    if let Some((elem, align, _, count)) = declaration(tokens) {
                        size = size.next_multiple_of(align) + elem * count as u32;
                        each.push(elem * count as u32);
                    }
                }
                current = Some(Entry {
                    name,
                    params_size: size,
                    params: each,
                    ..Entry::default()
                });
                if header.contains('{') {
                    depth += 1;
                }
                continue;
            }
            // Variables in global and constant memory (the driver finds both by name; LLVM
            // puts the NVPTX constructor pointers in `.const`).
            if let Some(at) = tokens.iter().position(|&t| t == ".global" || t == ".const") {
                if !tokens.contains(&".extern") {
                    if let Some((elem, _, name, count)) =
                        declaration(tokens[at + 1..].iter().copied())
                    {
                        module.globals.push((name, u64::from(elem) * count));
                    }
                }
            }
        } else if let Some(entry) = current.as_mut() {
            if tokens.first() == Some(&".local") {
                if let Some((elem, _, name, count)) = declaration(tokens[1..].iter().copied()) {
                    if name.starts_with("__local_depot") {
                        entry.frame = elem * count as u32;
                    }
                }
            }
            if tokens
                .iter()
                .any(|t| *t == "call" || t.starts_with("call."))
            {
                entry.calls = true;
            }
        }
        for c in trimmed.chars() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        if let Some(entry) = current.take() {
                            module.entries.push(entry);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    module.unfinished = unfinished(&text, &module, depth, current.as_ref());
    module
}

/// Why `text`, read as `module`, ends before a module does (see [`Module::unfinished`]).
fn unfinished(text: &str, module: &Module, depth: usize, open: Option<&Entry>) -> Option<String> {
    if let Some(entry) = open {
        return Some(format!("ends inside `.entry {}` (truncated?)", entry.name));
    }
    if depth > 0 {
        return Some("ends inside a block, a `}` short (truncated?)".into());
    }
    if module.target.is_empty() {
        return Some("no `.target` directive (truncated?)".into());
    }
    // The module-level statements end with `;` or `}`; only the header's directives do not.
    let last = text.lines().map(str::trim).rfind(|l| !l.is_empty())?;
    let header = [".version", ".target", ".address_size", ".file"];
    let ended = last.ends_with([';', '}']) || header.iter().any(|d| last.starts_with(d));
    (!ended).then(|| format!("the last statement `{last}` has no end (truncated?)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = r#"
//
// Generated by LLVM NVPTX Back-End
//

.version 7.8
.target sm_90
.address_size 64

.visible .global .align 8 .b8 __llvm_rpc_client[552];
.visible .const .align 8 .u64 __init_array_object_main_101 = main;
.extern .global .align 8 .b8 external[16];

	// .globl	_begin
.visible .entry _begin(
	.param .u32 _begin_param_0,
	.param .u64 .ptr .align 1 _begin_param_1,
	.param .u64 .ptr .align 1 _begin_param_2
)
{
	.reg .b64 	%rd<3>;
	ret;
}
.visible .entry _start(
	.param .u32 _start_param_0,
	.param .u64 .ptr .align 1 _start_param_1,
	.param .u64 .ptr .align 1 _start_param_2,
	.param .u64 .ptr .align 1 _start_param_3
)
{
	.local .align 8 .b8 	__local_depot1[24];
	.reg .b64 	%SP;
	{ // callseq 0, 0
	call.uni (retval0), main, (param0, param1);
	} // callseq 0
	ret;
}
.visible .entry _end()
{
	ret;
}
.visible .entry packed(.param .align 8 .b8 packed_param_0[12], .param .u8 packed_param_1)
{
	ret;
}
"#;

    #[test]
    fn reads_entries_parameters_frames_and_globals() {
        assert!(is_ptx(PTX.as_bytes()));
        let module = read(PTX);
        assert_eq!(module.version, "7.8");
        assert_eq!(module.target, "sm_90");
        let names: Vec<&str> = module.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["_begin", "_start", "_end", "packed"]);
        // int, then two pointers at 8: 4 + 4 padding + 16.
        assert_eq!(module.entries[0].params_size, 24);
        assert_eq!(module.entries[1].params_size, 32);
        assert_eq!(module.entries[1].frame, 24);
        assert!(module.entries[1].calls);
        assert!(!module.entries[0].calls);
        assert_eq!(module.entries[2].params_size, 0);
        assert_eq!(module.entries[3].params_size, 13);
        assert_eq!(module.entries[1].params, [4, 8, 8, 8]);
        assert_eq!(module.entries[3].params, [12, 1]);
        assert_eq!(
            module.globals,
            vec![
                ("__llvm_rpc_client".to_owned(), 552),
                ("__init_array_object_main_101".to_owned(), 8)
            ]
        );
    }

    #[test]
    fn text_that_is_not_ptx_reads_as_an_empty_unfinished_module() {
        assert!(!is_ptx(b"\x7fELF"));
        let module = read("garbage { { }");
        assert!(module.entries.is_empty() && module.globals.is_empty());
        assert!(module.unfinished.is_some());
    }

    #[test]
    fn a_whole_module_is_finished_and_every_cut_of_it_is_not() {
        assert_eq!(read(PTX).unfinished, None);
        assert_eq!(
            read(".version 7.8\n.target sm_90\n.address_size 64\n").unfinished,
            None
        );
        // Cut anywhere after the header, the text reads as whole only where a module-level
        // statement just ended.
        let body = PTX.trim_end();
        let first_global = body.find(".visible .global").unwrap();
        for cut in (first_global + 1..body.len() - 1).filter(|&at| body.is_char_boundary(at)) {
            let text = &body[..cut];
            if read(text).unfinished.is_none() {
                let mut code = text.lines().map(|l| l.split("//").next().unwrap().trim());
                let last = code.rfind(|l| !l.is_empty()).unwrap();
                assert!(last.ends_with([';', '}']), "read as whole: {text}");
            }
        }
        let cuts = [
            (".version 7.8\n", "no `.target`"),
            (
                &PTX[..PTX.find("ret;").unwrap()],
                "ends inside `.entry _begin`",
            ),
            (
                &PTX[..PTX.find("__llvm_rpc_client[5").unwrap() + 19],
                "has no end",
            ),
        ];
        for (text, why) in cuts {
            let unfinished = read(text).unfinished.unwrap_or_default();
            assert!(unfinished.contains(why), "{text}: {unfinished}");
        }
    }
}

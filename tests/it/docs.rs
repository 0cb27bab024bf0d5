//! The docs are tested: README.md and docs/*.md show commands, configuration snippets and
//! links, and each must work as shown. Fenced ```sh blocks are commands (every `pi0d`
//! subcommand and flag must exist), ```toml blocks are configuration (merged over
//! config/sim.toml, or the `base=` an info string names, they must pass `pi0d check`), any
//! other info string (```text) is not checked. The configuration reference's tables must
//! list every key of config/pi0d.example.toml and every range the code enforces. Each failure
//! names the file and line (docs/contributing.md, "Docs that are tested").

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use common::{root, scratch_dir};

/// A fenced block: where it starts, its info string and its lines (with their line numbers).
struct Block {
    file: String,
    line: usize,
    info: String,
    lines: Vec<(usize, String)>,
}

/// The fenced blocks of a Markdown text. A fence may be indented (inside a list item); its
/// content loses the same indentation.
fn blocks(file: &str, text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(Block, usize)> = None;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let indent = raw.len() - raw.trim_start().len();
        let fence = raw.trim_start().starts_with("```");
        match open.take() {
            None if fence => {
                let info = raw.trim_start().trim_start_matches('`').trim().to_string();
                let b = Block {
                    file: file.to_string(),
                    line: n,
                    info,
                    lines: Vec::new(),
                };
                open = Some((b, indent));
            }
            None => {}
            Some((b, _)) if fence => out.push(b),
            Some((mut b, ind)) => {
                let strip = raw.len() - raw.trim_start().len();
                b.lines.push((n, raw[strip.min(ind)..].to_string()));
                open = Some((b, ind));
            }
        }
    }
    out
}

/// The info string's first word (`sh`, `toml`, `text`) and its `key=value` attributes.
fn kind(b: &Block) -> (&str, BTreeMap<&str, &str>) {
    let mut words = b.info.split_whitespace();
    let first = words.next().unwrap_or("");
    let attrs = words.filter_map(|w| w.split_once('=')).collect();
    (first, attrs)
}

/// The command lines of a ```sh block: continuations joined, comments dropped, split at
/// `&&`, `;` and `|`; each with the line it starts on.
fn commands(b: &Block) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (n, line) in &b.lines {
        let code = match line.find(" #") {
            Some(i) => &line[..i],
            None if line.trim_start().starts_with('#') => "",
            None => line.as_str(),
        };
        let (start, mut text) = pending.take().unwrap_or((*n, String::new()));
        let code = code.trim_end();
        if let Some(head) = code.strip_suffix('\\') {
            text.push_str(head);
            text.push(' ');
            pending = Some((start, text));
            continue;
        }
        text.push_str(code);
        for part in text.split(&['&', ';', '|'][..]) {
            let words: Vec<String> = part.split_whitespace().map(str::to_string).collect();
            if !words.is_empty() {
                out.push((start, words));
            }
        }
    }
    out
}

/// The pi0d arguments a command runs, if it runs pi0d: `pi0d ...`,
/// `target/release/pi0d ...` or `cargo run --release -- ...`.
fn pi0d_args(words: &[String]) -> Option<&[String]> {
    let first = words.first()?.as_str();
    if first == "pi0d" || first.ends_with("target/release/pi0d") {
        return Some(&words[1..]);
    }
    if first == "cargo" && words.get(1).map(String::as_str) == Some("run") {
        let dashes = words.iter().position(|w| w == "--")?;
        return Some(&words[dashes + 1..]);
    }
    None
}

/// What is wrong with the commands of the ```sh blocks; `help` gives a subcommand's `--help`
/// output, or None when pi0d has no such subcommand.
fn command_problems(blocks: &[Block], help: &mut dyn FnMut(&str) -> Option<String>) -> Vec<String> {
    let mut problems = Vec::new();
    let features = cargo_features();
    for b in blocks.iter().filter(|b| matches!(kind(b).0, "sh" | "bash")) {
        for (line, words) in commands(b) {
            let at = format!("{}:{line}", b.file);
            for w in &words {
                let path = w.trim_start_matches("./");
                let repo_path = ["tools/", "config/", "systemd/", "launch/", "models/"]
                    .iter()
                    .any(|p| path.starts_with(p));
                if repo_path && !root().join(path).exists() {
                    problems.push(format!("{at}: `{w}` does not exist"));
                }
            }
            if words[0] == "cargo" {
                for pair in words.windows(2) {
                    if pair[0] == "--features" {
                        for f in pair[1].split(',') {
                            if !features.contains(f) {
                                problems.push(format!("{at}: no cargo feature `{f}`"));
                            }
                        }
                    }
                    if pair[0] == "--bench"
                        && !root().join(format!("benches/{}.rs", pair[1])).exists()
                    {
                        problems.push(format!("{at}: no bench `{}`", pair[1]));
                    }
                }
            }
            let Some(args) = pi0d_args(&words) else {
                continue;
            };
            let Some(sub) = args.first() else {
                problems.push(format!("{at}: pi0d without a subcommand"));
                continue;
            };
            let Some(text) = help(sub) else {
                problems.push(format!("{at}: pi0d has no subcommand `{sub}`"));
                continue;
            };
            // What follows --ros-args is ROS's, split off before pi0d parses its own flags.
            let own = args.iter().take_while(|a| a.as_str() != "--ros-args");
            for flag in own.filter(|a| a.starts_with("--") && a.len() > 2) {
                let name = flag.split('=').next().unwrap_or(flag);
                if !lists_flag(&text, name) {
                    problems.push(format!("{at}: `pi0d {sub} --help` does not list `{name}`"));
                }
            }
        }
    }
    problems
}

/// Whether help text lists `flag` as a whole word (`--rtc` is not `--rtc-schedule`).
fn lists_flag(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(i, _)| {
        let next = help[i + flag.len()..].chars().next();
        !matches!(next, Some(c) if c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

fn cargo_features() -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let manifest: toml::Table = text.parse().unwrap();
    let features = manifest.get("features").and_then(|f| f.as_table());
    features
        .map(|f| f.keys().cloned().collect())
        .unwrap_or_default()
}

/// `pi0d SUB --help`, or None when SUB is no subcommand.
fn real_help(sub: &str) -> Option<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args([sub, "--help"])
        .output()
        .expect("pi0d runs");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).to_string())
}

/// Settings that name files, made absolute against the directory of the file that set them
/// (pi0d reads a configuration's relative paths against its directory).
const PATH_KEYS: [&str; 8] = [
    "robot.urdf",
    "policy.checkpoint",
    "policy.arch",
    "policy.tokenizer",
    "policy.replay_file",
    "policy.onnx.model_dir",
    "policy.acl.model_dir",
    "record.path",
];

fn absolutize(t: &mut toml::Table, dir: &Path) {
    for key in PATH_KEYS {
        let mut value: Option<&mut toml::Value> = None;
        for part in key.split('.') {
            value = match value {
                None => t.get_mut(part),
                Some(toml::Value::Table(inner)) => inner.get_mut(part),
                Some(_) => None,
            };
            if value.is_none() {
                break;
            }
        }
        if let Some(toml::Value::String(s)) = value {
            if Path::new(s.as_str()).is_relative() {
                *s = dir.join(&*s).display().to_string();
            }
        }
    }
}

/// `over` merged into `base`: tables merge key by key, anything else replaces.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// What is wrong with the ```toml blocks: each, merged over its base configuration, must
/// pass `pi0d check`.
fn config_problems(blocks: &[Block], dir: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        let (first, attrs) = kind(b);
        if first != "toml" {
            continue;
        }
        let at = format!("{}:{}", b.file, b.line);
        let base_name = attrs.get("base").copied().unwrap_or("config/sim.toml");
        let base_path = root().join(base_name);
        let Ok(base_text) = std::fs::read_to_string(&base_path) else {
            problems.push(format!("{at}: no base configuration {base_name}"));
            continue;
        };
        let text: String = b.lines.iter().map(|(_, l)| format!("{l}\n")).collect();
        let fragment: toml::Table = match text.parse() {
            Ok(t) => t,
            Err(e) => {
                problems.push(format!("{at}: not TOML: {e}"));
                continue;
            }
        };
        let mut config: toml::Table = base_text.parse().unwrap();
        let base_dir = base_path.parent().unwrap_or(root());
        absolutize(&mut config, base_dir);
        merge(&mut config, fragment);
        // A snippet's own relative paths are read as from the repository's root.
        absolutize(&mut config, root());
        let file = dir.join(format!("snippet-{i}.toml"));
        std::fs::write(&file, toml::to_string(&config).unwrap()).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_pi0d"))
            .args(["check", "--config"])
            .arg(&file)
            // The snippets name this variable for an API key.
            .env("PI0D_POLICY_KEY", "docs-test-key")
            .output()
            .expect("pi0d runs");
        if !out.status.success() {
            problems.push(format!(
                "{at}: fails `pi0d check` over {base_name} (exit {:?}):\n{}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    problems
}

/// A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens.
fn anchor(heading: &str) -> String {
    let text = heading.trim_start_matches('#').trim().to_lowercase();
    text.chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The lines outside fenced blocks, with their numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .into_iter()
        .filter(|(_, l)| l.starts_with('#'))
        .map(|(_, l)| anchor(l))
        .collect()
}

/// What is wrong with the relative links of `file` (a path under the root), and with the
/// ready configurations and pages it names.
fn link_problems(file: &str, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let dir = root()
        .join(file)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    for (n, line) in prose(text) {
        let at = format!("{file}:{n}");
        for (i, _) in line.match_indices("](") {
            let rest = &line[i + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = &rest[..end];
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = target.split_once('#').unwrap_or((target, ""));
            if path.is_empty() {
                if !anchors(text).contains(fragment) {
                    problems.push(format!("{at}: link to {target}: no such heading"));
                }
                continue;
            }
            let resolved = dir.join(path);
            if !resolved.exists() {
                problems.push(format!("{at}: link to {target}: no such file"));
                continue;
            }
            let markdown = resolved.extension().is_some_and(|e| e == "md");
            if !fragment.is_empty() && markdown {
                let page = std::fs::read_to_string(&resolved).unwrap_or_default();
                if !anchors(&page).contains(fragment) {
                    problems.push(format!("{at}: link to {target}: no such heading"));
                }
            }
        }
    }
    for (n, line) in text.lines().enumerate() {
        for prefix in ["config/", "docs/"] {
            for (i, _) in line.match_indices(prefix) {
                let name: String = line[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '-' | '.'))
                    .collect();
                let name = name.trim_end_matches('.');
                let named = name.ends_with(".toml") || name.ends_with(".md");
                // `../config/x.toml` and `config/x.toml` both name the repository's file.
                if named && !root().join(name).exists() {
                    problems.push(format!(
                        "{file}:{}: names {name}, which does not exist",
                        n + 1
                    ));
                }
            }
        }
    }
    problems
}

/// README.md and docs/*.md: (path under the root, text).
fn pages() -> Vec<(String, String)> {
    let mut names = vec!["README.md".to_string()];
    let docs = std::fs::read_dir(root().join("docs")).unwrap();
    let mut md: Vec<String> = docs
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    md.sort();
    names.extend(md);
    names
        .into_iter()
        .map(|n| {
            let text = std::fs::read_to_string(root().join(&n)).unwrap();
            (n, text)
        })
        .collect()
}

fn all_blocks() -> Vec<Block> {
    pages().iter().flat_map(|(n, t)| blocks(n, t)).collect()
}

fn assert_none(what: &str, problems: Vec<String>) {
    assert!(problems.is_empty(), "{what}:\n{}", problems.join("\n"));
}

#[test]
fn when_docs_show_commands_expect_each_subcommand_and_flag_to_exist() {
    let blocks = all_blocks();
    let checked = blocks.iter().filter(|b| kind(b).0 == "sh").count();
    assert!(checked >= 5, "only {checked} ```sh blocks found");
    let mut cache: BTreeMap<String, Option<String>> = BTreeMap::new();
    let mut help = |sub: &str| {
        cache
            .entry(sub.to_string())
            .or_insert_with(|| real_help(sub))
            .clone()
    };
    assert_none(
        "commands the docs show",
        command_problems(&blocks, &mut help),
    );
}

#[test]
fn when_docs_show_configuration_expect_each_snippet_to_pass_check() {
    let blocks = all_blocks();
    let checked = blocks.iter().filter(|b| kind(b).0 == "toml").count();
    assert!(checked >= 5, "only {checked} ```toml blocks found");
    let dir = scratch_dir("docs-snippets");
    assert_none(
        "configuration the docs show",
        config_problems(&blocks, &dir),
    );
}

#[test]
fn when_docs_link_expect_every_relative_link_and_named_file_to_exist() {
    let problems = pages()
        .iter()
        .flat_map(|(n, t)| link_problems(n, t))
        .collect();
    assert_none("links in the docs", problems);
}

/// The keys config/pi0d.example.toml shows, commented out or not, as dotted paths:
/// `[limits.joints.NAME]` is `limits.joints.*`, `[[ros.commands]]` is `ros.commands[]`.
/// A commented key belongs to the last header above it, commented or not, unless a live key
/// came between (that one returned the reader to the live section).
fn example_keys(text: &str) -> Vec<String> {
    let mut live = String::new();
    let mut any = String::new();
    let mut keys = Vec::new();
    for raw in text.lines() {
        let t = raw.trim_start();
        let commented = t.starts_with('#');
        let body = if commented { t[1..].trim() } else { t.trim() };
        if let Some(h) = header(body) {
            any = h;
            if !commented {
                live = any.clone();
            }
            continue;
        }
        let Some((k, _)) = body.split_once('=') else {
            continue;
        };
        let k = k.trim();
        let is_key = !k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !is_key {
            continue;
        }
        if !commented {
            any = live.clone();
        }
        let full = match any.as_str() {
            "sim.initial_position" | "sim.task.reach" | "sim.task.sweep" => format!("{any}.*"),
            "" => k.to_string(),
            s => format!("{s}.{k}"),
        };
        if !keys.contains(&full) {
            keys.push(full);
        }
    }
    keys
}

fn header(body: &str) -> Option<String> {
    let body = body.split(" #").next().unwrap_or(body).trim();
    let array = body.starts_with("[[");
    let name = body
        .trim_start_matches('[')
        .strip_suffix(']')?
        .trim_end_matches(']');
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.');
    if !ok {
        return None;
    }
    let name = match name.strip_prefix("limits.joints.") {
        Some(_) => "limits.joints.*".to_string(),
        None => name.to_string(),
    };
    Some(if array { format!("{name}[]") } else { name })
}

/// The reference's rows after "## Every setting": setting -> (range, unit).
fn reference_rows(text: &str) -> BTreeMap<String, (String, String)> {
    let start = text.find("## Every setting").unwrap_or(text.len());
    let mut rows = BTreeMap::new();
    for line in text[start..].lines() {
        let Some(rest) = line.strip_prefix("| `") else {
            continue;
        };
        // setting | example | default | range | unit | what
        let cells: Vec<&str> = rest.split(" | ").collect();
        if cells.len() < 6 {
            continue;
        }
        let key = cells[0].trim_end_matches('`').to_string();
        let (range, unit) = (cells[3].trim(), cells[4].trim());
        rows.insert(key, (range.to_string(), unit.to_string()));
    }
    rows
}

/// docs/config-ranges.md's rows (generated from the code): setting -> (range, unit).
fn code_ranges(text: &str) -> BTreeMap<String, (String, String)> {
    let mut rows = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if let [key, min, max, unit] = cells[..] {
            let key = key.trim_matches('`').to_string();
            rows.insert(key, (format!("{min} to {max}"), unit.to_string()));
        }
    }
    rows
}

#[test]
fn when_the_reference_lists_settings_expect_the_example_file_and_the_ranges_in_step() {
    let read = |p: &str| std::fs::read_to_string(root().join(p)).unwrap();
    let example = example_keys(&read("config/pi0d.example.toml"));
    let reference = reference_rows(&read("docs/configuration.md"));
    let ranges = code_ranges(&read("docs/config-ranges.md"));
    assert!(
        example.len() > 100 && ranges.len() > 50,
        "{example:?} {ranges:?}"
    );
    let mut problems = Vec::new();
    for k in &example {
        if !reference.contains_key(k) && !reference.contains_key(&format!("{k}[]")) {
            problems.push(format!(
                "docs/configuration.md lacks `{k}` (config/pi0d.example.toml has it)"
            ));
        }
    }
    for (k, want) in &ranges {
        match reference.get(k) {
            None => problems.push(format!(
                "docs/configuration.md lacks `{k}` (the code gives it a range)"
            )),
            Some(got) if got != want => problems.push(format!(
                "docs/configuration.md: `{k}` shows {got:?}, the code's range is {want:?}"
            )),
            Some(_) => {}
        }
    }
    for k in reference.keys() {
        let known = example.contains(k)
            || ranges.contains_key(k)
            || example.contains(&k.trim_end_matches("[]").to_string());
        if !known {
            problems.push(format!(
                "docs/configuration.md lists `{k}`, which pi0d.example.toml lacks"
            ));
        }
    }
    assert_none("the configuration reference", problems);
}

const BAD: &str = "# A page\n\nText.\n\n```sh\npi0d run --config config/sim.toml \\\n    --no-such-flag\npi0d fly --config x\ncargo build --features warp\n```\n\n```toml\n[control]\nrate_hz = 5000\n```\n\n```text\npi0d fly\n```\n\nSee [nowhere](nowhere.md) and [here](#a-pag) and config/none.toml.\n";

#[test]
fn when_a_page_has_bad_snippets_expect_each_named_by_file_and_line() {
    let blocks = blocks("docs/bad.md", BAD);
    assert_eq!(blocks.len(), 3);
    let mut help =
        |sub: &str| (sub == "run").then(|| "  --config <CONFIG>\n  --dry-run\n".to_string());
    let problems = command_problems(&blocks, &mut help);
    assert_eq!(
        problems,
        [
            "docs/bad.md:6: `pi0d run --help` does not list `--no-such-flag`",
            "docs/bad.md:8: pi0d has no subcommand `fly`",
            "docs/bad.md:9: no cargo feature `warp`",
        ]
    );
    let dir = scratch_dir("docs-bad");
    let problems = config_problems(&blocks, &dir);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("docs/bad.md:12: fails `pi0d check`"),
        "{problems:?}"
    );
    assert!(problems[0].contains("control.rate_hz"), "{problems:?}");
    let problems = link_problems("docs/bad.md", BAD);
    assert_eq!(
        problems,
        [
            "docs/bad.md:21: link to nowhere.md: no such file",
            "docs/bad.md:21: link to #a-pag: no such heading",
            "docs/bad.md:21: names config/none.toml, which does not exist",
        ]
    );
}

#[test]
fn when_the_example_file_nests_sections_expect_keys_under_the_right_one() {
    let text = "[policy]\nkind = \"pi0\"\n# [policy.onnx]\n# provider = \"cpu\"\naction_joints = []\n# latency_s = 0.0\n# [[ros.commands]]\n# rate_hz = 50\n[limits.joints.gripper]\njerk = 1.0\n[sim.initial_position]\nelbow = 0.6\n";
    assert_eq!(
        example_keys(text),
        [
            "policy.kind",
            "policy.onnx.provider",
            "policy.action_joints",
            "policy.latency_s",
            "ros.commands[].rate_hz",
            "limits.joints.*.jerk",
            "sim.initial_position.*",
        ]
    );
    assert_eq!(
        anchor("## Real-time chunking (`[control.rtc]`)"),
        "real-time-chunking-controlrtc"
    );
    assert!(lists_flag("  --rtc-schedule <S>\n  --rtc\n", "--rtc"));
    assert!(!lists_flag("  --rtc-schedule <S>\n", "--rtc"));
}

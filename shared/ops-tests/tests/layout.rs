//! The workspace's cut, as ARCHITECTURE.md describes it: crates along their dependencies, no
//! module circles, a short README.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// `cargo tree` of `package` (`edges`: which kinds of dependency), one crate name per line.
fn tree(package: &str, edges: &str) -> BTreeSet<String> {
    let out = testkit::cargo()
        .current_dir(testkit::repo())
        .args([
            "tree",
            "--offline",
            "--prefix",
            "none",
            "--format",
            "{lib}",
            "-e",
            edges,
        ])
        .args(["-p", package])
        .output()
        .expect("running cargo tree");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().next().unwrap_or("").to_owned())
        .collect()
}

#[test]
fn the_protocol_crate_depends_on_no_runtime_server_database_tls_metrics_or_cli_crate() {
    let deps = tree("protocol", "normal,build");
    assert!(deps.contains("postcard"), "the tree was read: {deps:?}");
    for heavy in [
        "tokio",
        "hyper",
        "tokio_postgres",
        "rustls",
        "prometheus_client",
        "clap",
    ] {
        assert!(!deps.contains(heavy), "protocol depends on {heavy}");
    }
}

#[test]
fn neither_service_depends_on_the_other_even_in_its_tests() {
    let redirector = tree("redirector", "normal,build,dev");
    assert!(redirector.contains("testkit"), "the tree was read");
    assert!(
        !redirector.contains("collector"),
        "the redirector depends on the collector"
    );
    let collector = tree("collector", "normal,build,dev");
    assert!(collector.contains("testkit"), "the tree was read");
    assert!(
        !collector.contains("redirector"),
        "the collector depends on the redirector"
    );
    for service in ["redirector", "collector"] {
        let manifest = read(&testkit::repo().join(service).join("Cargo.toml"));
        assert!(
            !manifest.contains("[features]"),
            "{service} has features (test support belongs in testkit)"
        );
    }
}

/// Each crate's top-level modules, with the ones each names through `crate::`.
fn module_uses(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut uses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in rust_files(src) {
        let rel = file.strip_prefix(src).unwrap();
        let module = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = module.trim_end_matches(".rs").to_owned();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = read(&file);
        let named = uses.entry(module.clone()).or_default();
        for (i, _) in text.match_indices("crate::") {
            let rest = &text[i + "crate::".len()..];
            let names: Vec<&str> = match rest.strip_prefix('{') {
                Some(group) => group[..group.find('}').unwrap_or(0)].split(',').collect(),
                None => vec![rest],
            };
            for name in names {
                let name: String = name
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    named.insert(name);
                }
            }
        }
    }
    uses
}

fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let repo = testkit::repo();
    let mut circles = Vec::new();
    for src in [
        "redirector/src",
        "collector/src",
        "shared/src",
        "shared/protocol/src",
        "shared/clicktap/src",
        "shared/testkit/src",
    ] {
        let uses = module_uses(&repo.join(src));
        assert!(!uses.is_empty(), "no modules found in {src}");
        for (a, named) in &uses {
            for b in named {
                if a < b && uses.get(b).is_some_and(|back| back.contains(a)) {
                    circles.push(format!("{src}: {a} <-> {b}"));
                }
            }
        }
    }
    assert!(
        circles.is_empty(),
        "modules importing each other: {circles:#?}"
    );
}

#[test]
fn the_readme_is_short_and_shows_the_two_commands() {
    let readme = read(&testkit::repo().join("README.md"));
    let lines = readme.lines().count();
    assert!(lines <= 250, "README.md is {lines} lines");
    for command in ["scripts/dev", "cargo test --workspace"] {
        assert!(
            readme.contains(command),
            "README.md does not show {command}"
        );
    }
}

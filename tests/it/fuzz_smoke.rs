//! A seconds-long smoke run of every fuzz target: the seed corpora, every recorded crash
//! (`tests/fuzz/regressions/<target>/`), and seeded mutations of them. The long runs use
//! cargo fuzz (design/reliability.md).

use std::path::PathBuf;

use medea::bench::fleet::Rng;

fn inputs(target: &str) -> Vec<Vec<u8>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz");
    let mut out = Vec::new();
    for dir in ["seeds", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        for e in entries {
            out.push(std::fs::read(e.unwrap().path()).unwrap());
        }
    }
    assert!(!out.is_empty(), "no seeds for fuzz target {target}");
    out
}

const TOKENS: &[&[u8]] = &[
    b"\n",
    b": ",
    b"- ",
    b"---\n",
    b"\"",
    b"'",
    b"{",
    b"}",
    b"[",
    b"]",
    b"&a ",
    b"*a",
    b"!!str ",
    b"#",
    b"\t",
    b"=",
    b",",
    b"\xff",
    b"\0",
    b"v1.13.9",
    b"-----END SSH SIGNATURE-----",
];

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..=rng.below(4) {
        match rng.below(4) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len() as u64) as usize;
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len() as u64) as usize;
                v.truncate(i);
            }
            2 => {
                let i = rng.below(v.len() as u64 + 1) as usize;
                let t = TOKENS[rng.below(TOKENS.len() as u64) as usize];
                v.splice(i..i, t.iter().copied());
            }
            _ if !v.is_empty() => {
                let a = rng.below(v.len() as u64) as usize;
                let b = rng.below(v.len() as u64) as usize;
                let (a, b) = (a.min(b), a.max(b));
                let chunk = v[a..b].to_vec();
                v.splice(b..b, chunk);
            }
            _ => {}
        }
    }
    v
}

fn smoke(target: &str, f: fn(&[u8]), rounds: usize) {
    let seeds = inputs(target);
    let mut rng = Rng::new(0x5eed);
    for s in &seeds {
        f(s);
    }
    for _ in 0..rounds {
        let s = &seeds[rng.below(seeds.len() as u64) as usize];
        f(&mutate(&mut rng, s));
    }
}

#[test]
fn desired_loader() {
    smoke("desired_loader", medea::fuzz::desired_loader, 400);
}

#[test]
fn allowed_signers() {
    smoke("allowed_signers", medea::fuzz::allowed_signers, 2000);
}

#[test]
fn armored_signature() {
    smoke("armored_signature", medea::fuzz::armored_signature, 2000);
}

#[test]
fn talosconfig() {
    smoke("talosconfig", medea::fuzz::talosconfig, 1000);
}

#[test]
fn kubeconfig() {
    smoke("kubeconfig", medea::fuzz::kubeconfig, 400);
}

#[test]
fn sim_http() {
    smoke("sim_http", medea::fuzz::sim_http, 300);
}

//! Replays the fuzz corpus (real captured messages) and mutations of it
//! through the fuzz target's body: no panics, idempotent encode/decode.

use std::path::Path;

use pgwal_protocol::fuzzing::decode_everything;

#[test]
fn corpus_replay_and_mutations() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/decode");
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .expect("fuzz corpus")
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    seeds.sort();
    assert!(seeds.len() > 50, "corpus too small: {}", seeds.len());
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for seed in &seeds {
        decode_everything(seed);
        for n in 0..seed.len().min(64) {
            decode_everything(&seed[..n]);
        }
        for _ in 0..200 {
            let mut m = seed.clone();
            for _ in 0..=(next() % 3) {
                let i = 1 + (next() as usize) % (m.len().max(2) - 1);
                if i < m.len() {
                    m[i] = next() as u8;
                }
            }
            decode_everything(&m);
        }
    }
}

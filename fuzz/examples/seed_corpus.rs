//! Writes the seed corpus, `corpus/<target>/seed-<n>`: a few valid encoded
//! requests per target (see `respcoord_fuzz::seeds`).
//!
//!     cargo run --manifest-path fuzz/Cargo.toml --example seed_corpus

use std::{fs, path::Path};

fn main() -> std::io::Result<()> {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (target, inputs) in respcoord_fuzz::seeds() {
        let dir = corpus.join(target);
        fs::create_dir_all(&dir)?;
        for (n, input) in inputs.iter().enumerate() {
            fs::write(dir.join(format!("seed-{n}")), input)?;
        }
        println!("{target}: {} seeds", inputs.len());
    }
    Ok(())
}

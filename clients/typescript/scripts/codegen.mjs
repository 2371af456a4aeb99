// Generates src/gen from the proto with buf + ts-proto (both from npm, no
// system protoc). With --check it generates into a temporary directory and
// fails when that differs from the committed files, so CI catches a proto
// change without regenerated code.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import console from "node:console";
import process from "node:process";
import { URL, fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));
const proto = join(root, "..", "..", "proto");
const committed = join(root, "src", "gen");
const check = process.argv.includes("--check");

function generate(outDir) {
  const template = readFileSync(join(root, "buf.gen.yaml"), "utf8").replace(
    "out: src/gen",
    `out: ${JSON.stringify(outDir)}`,
  );
  const templateFile = join(mkdtempSync(join(tmpdir(), "respcoord-buf-")), "buf.gen.yaml");
  writeFileSync(templateFile, template);
  execFileSync(join(root, "node_modules", ".bin", "buf"), ["generate", proto, "--template", templateFile], {
    cwd: root,
    stdio: "inherit",
  });
  rmSync(join(templateFile, ".."), { recursive: true });
}

function files(dir) {
  const out = new Map();
  const walk = (d) => {
    for (const name of readdirSync(d)) {
      const path = join(d, name);
      if (statSync(path).isDirectory()) walk(path);
      else out.set(relative(dir, path), readFileSync(path, "utf8"));
    }
  };
  walk(dir);
  return out;
}

if (!check) {
  rmSync(committed, { recursive: true, force: true });
  generate(committed);
} else {
  const fresh = mkdtempSync(join(tmpdir(), "respcoord-gen-"));
  try {
    generate(fresh);
    const want = files(fresh);
    const have = files(committed);
    const differing = [...new Set([...want.keys(), ...have.keys()])].filter((f) => want.get(f) !== have.get(f));
    if (differing.length > 0) {
      console.error(`src/gen does not match the proto (run npm run codegen): ${differing.join(", ")}`);
      process.exit(1);
    }
    console.log(`src/gen matches the proto (${want.size} file(s))`);
  } finally {
    rmSync(fresh, { recursive: true, force: true });
  }
}

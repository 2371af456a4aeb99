// Lint: typescript-eslint's type-checked rules on the sources, tests and example.
import js from "@eslint/js";
import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["dist/", "build/", "node_modules/", "src/gen/"] },
  js.configs.recommended,
  ...tseslint.configs.strictTypeChecked,
  {
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      "@typescript-eslint/restrict-template-expressions": ["error", { allowNumber: true, allow: [{ from: "lib", name: "BigInt" }] }],
      "@typescript-eslint/no-floating-promises": "error",
      "@typescript-eslint/no-misused-promises": "error",
    },
  },
  { files: ["**/*.js", "**/*.mjs"], ...tseslint.configs.disableTypeChecked },
  // The quickstart is plain JavaScript for Node, as a user writes it: Node's globals.
  { files: ["examples/**/*.mjs"], languageOptions: { globals: { console: "readonly", process: "readonly" } } },
);

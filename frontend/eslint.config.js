// ESLint (flat config): JavaScript's and typescript-eslint's recommended rules and React's rules of hooks, with the
// exhaustive-deps check as an error. `npm run lint` (and `make lint`, so `make test`) runs it; 0 problems allowed.
import js from "@eslint/js";
import reactHooks from "eslint-plugin-react-hooks";
import globals from "globals";
import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["dist", "node_modules", "src/lib/schema.d.ts"] },
  {
    files: ["**/*.{ts,tsx}"],
    extends: [js.configs.recommended, ...tseslint.configs.recommended, reactHooks.configs.flat.recommended],
    languageOptions: { ecmaVersion: 2022, globals: globals.browser },
    rules: {
      "react-hooks/exhaustive-deps": "error",
    },
  },
);

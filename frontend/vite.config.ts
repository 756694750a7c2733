import { defineConfig } from "vite";
import react from "@vitejs/plugin-react";

// The API serves dist/index.html at "/" and the built assets; all API calls are relative (/api/...).
export default defineConfig({
  plugins: [react()],
  base: "./",
  build: { outDir: "dist", chunkSizeWarningLimit: 1000 },
  // the planner's example plans are imported from ../examples (the repository's own files)
  server: { proxy: { "/api": "http://127.0.0.1:8765" }, fs: { allow: [".", "../examples"] } },
});

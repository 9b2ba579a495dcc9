// Vite builds the app into web/dist, which `flywheel serve` serves at / (backend/web_app.py).
// No plugins: esbuild compiles the TSX with Preact's JSX runtime (tsconfig "jsxImportSource").
import { defineConfig } from "vite";

export default defineConfig({
  base: "/",
  build: {
    outDir: "dist",
    emptyOutDir: true,
    sourcemap: false,
    // No inline <script> or data: URLs: the server's Content-Security-Policy allows only 'self'.
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
    chunkSizeWarningLimit: 1500,
  },
  esbuild: { jsx: "automatic", jsxImportSource: "preact" },
  server: {
    proxy: { "/v1": { target: "http://127.0.0.1:8421", ws: true }, "/health": "http://127.0.0.1:8421" },
  },
});

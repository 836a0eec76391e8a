// The SPA is static files that `strata serve` mounts at /; the API is same-origin (/api/v1/).
// `npm run dev` proxies the API to a running collector (STRATA_SERVER, default 127.0.0.1:7878).
import { defineConfig } from 'vitest/config';

export default defineConfig({
  base: './',
  build: {
    outDir: process.env.STRATA_WEB_OUT || 'dist',
    // build/web also holds CMake's files for web/: never empty it (CMake removes the old assets/).
    emptyOutDir: !process.env.STRATA_WEB_OUT,
    chunkSizeWarningLimit: 1000,
  },
  server: {
    proxy: { '/api': `http://${process.env.STRATA_SERVER || '127.0.0.1:7878'}` },
  },
  test: {
    dir: '../tests/web',
    include: ['**/*.test.ts'],
    globals: true,
    environment: 'node',
  },
});

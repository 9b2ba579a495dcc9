// highlight.js with the languages agents mostly touch (the full bundle is ~1 MB). Its output is
// escaped HTML: highlight.js escapes the source text before it adds its <span>s.

import hljs from "highlight.js/lib/core";
import bash from "highlight.js/lib/languages/bash";
import css from "highlight.js/lib/languages/css";
import diff from "highlight.js/lib/languages/diff";
import go from "highlight.js/lib/languages/go";
import java from "highlight.js/lib/languages/java";
import javascript from "highlight.js/lib/languages/javascript";
import json from "highlight.js/lib/languages/json";
import markdown from "highlight.js/lib/languages/markdown";
import python from "highlight.js/lib/languages/python";
import rust from "highlight.js/lib/languages/rust";
import shell from "highlight.js/lib/languages/shell";
import sql from "highlight.js/lib/languages/sql";
import typescript from "highlight.js/lib/languages/typescript";
import xml from "highlight.js/lib/languages/xml";
import yaml from "highlight.js/lib/languages/yaml";
import ini from "highlight.js/lib/languages/ini";
import plaintext from "highlight.js/lib/languages/plaintext";
import cpp from "highlight.js/lib/languages/cpp";

// plaintext: what diff2html asks for when a file name has no known extension
const LANGS = { bash, css, diff, go, java, javascript, json, markdown, python, rust, shell, sql, typescript, xml, yaml, ini, cpp, plaintext };
for (const [name, lang] of Object.entries(LANGS)) hljs.registerLanguage(name, lang);

const BY_EXT: Record<string, string> = {
  py: "python", js: "javascript", mjs: "javascript", cjs: "javascript", jsx: "javascript", ts: "typescript",
  tsx: "typescript", go: "go", rs: "rust", java: "java", json: "json", md: "markdown", sh: "bash", bash: "bash",
  css: "css", html: "xml", xml: "xml", svg: "xml", yml: "yaml", yaml: "yaml", toml: "ini", ini: "ini", cfg: "ini",
  sql: "sql", c: "cpp", h: "cpp", cc: "cpp", cpp: "cpp", hpp: "cpp", diff: "diff", patch: "diff",
};

export function languageOf(path: string): string | undefined {
  const ext = path.split(".").pop()?.toLowerCase() ?? "";
  return BY_EXT[ext];
}

/** Highlighted, escaped HTML for `code` (plain escaped text for an unknown language). */
export function highlight(code: string, language: string | undefined): string {
  if (language && hljs.getLanguage(language)) return hljs.highlight(code, { language, ignoreIllegals: true }).value;
  return escapeHtml(code);
}

export function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]!);
}

export { hljs };

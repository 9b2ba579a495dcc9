// Small SVG icons (no icon font, no emoji: both depend on fonts a machine may not have).
// Decorative: the buttons that hold them carry the label.

const PATHS: Record<string, string> = {
  first: "M5 4h2v16H5zM19 4v16L8 12z",
  prevStep: "M11 4v16L2 12zM22 4v16l-9-8z",
  back: "M17 4v16L6 12z",
  play: "M7 4v16l12-8z",
  pause: "M6 4h4v16H6zM14 4h4v16h-4z",
  forward: "M7 4v16l11-8z",
  nextStep: "M2 4v16l9-8zM13 4v16l9-8z",
  last: "M17 4h2v16h-2zM5 4v16l11-8z",
  up: "M2 21h4V9H2zm20-11a2 2 0 0 0-2-2h-6.3l1-4.6V3a1.5 1.5 0 0 0-.4-1L13 1 6.6 7.6A2 2 0 0 0 6 9v10a2 2 0 0 0 2 2h9a2 2 0 0 0 1.8-1.2l3-7.1.2-.7z",
  down: "M22 3h-4v12h4zM2 14a2 2 0 0 0 2 2h6.3l-1 4.6V21a1.5 1.5 0 0 0 .4 1l1.1 1 6.6-6.6A2 2 0 0 0 18 15V5a2 2 0 0 0-2-2H7a2 2 0 0 0-1.8 1.2l-3 7.1L2 12z",
};

export type IconName = keyof typeof PATHS;

export function Icon({ name }: { name: IconName }) {
  return (
    <svg class="icon" viewBox="0 0 24 24" width="14" height="14" aria-hidden="true" focusable="false">
      <path d={PATHS[name]} fill="currentColor" />
    </svg>
  );
}

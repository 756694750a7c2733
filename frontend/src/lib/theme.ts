import { useEffect, useState } from "react";

// Light and dark follow the system's prefers-color-scheme (styles/theme.css defines both palettes as CSS
// variables). Canvas charts cannot read CSS variables, so they resolve them here and are redrawn on a switch.

const DARK = "(prefers-color-scheme: dark)";

export type Scheme = "light" | "dark";

export function currentScheme(): Scheme {
  return typeof window !== "undefined" && window.matchMedia?.(DARK).matches ? "dark" : "light";
}

/** The system's colour scheme, updated when it changes. */
export function useColorScheme(): Scheme {
  const [scheme, setScheme] = useState<Scheme>(currentScheme);
  useEffect(() => {
    const mq = window.matchMedia?.(DARK);
    if (!mq) return;
    const on = () => setScheme(mq.matches ? "dark" : "light");
    mq.addEventListener("change", on);
    return () => mq.removeEventListener("change", on);
  }, []);
  return scheme;
}

/** "var(--name)" as the colour it stands for now; any other colour as it is. */
export function resolveColor(color: string): string {
  const m = /^var\((--[\w-]+)\)$/.exec(color.trim());
  if (!m) return color;
  return getComputedStyle(document.documentElement).getPropertyValue(m[1]).trim() || "#888";
}

/** The reference ink of charts (planner predictions, capacity lines): near-black in light, near-white in dark. */
export const INK = "var(--chart-ink)";

/** What a key does to a focused chart's step range [min, max]: "+" (or "=") halves it around its middle, "-"
 * doubles it, the left and right arrows move it by a quarter, "0" asks for the whole run; any other key: null.
 * Steps are whole numbers: every move is a whole number of steps, so panning keeps the range's width. */
export function zoomKey(key: string, min: number | null | undefined, max: number | null | undefined): [number, number] | "reset" | null {
  if (key === "0") return "reset";
  if (min == null || max == null || !(max > min)) return null;
  const span = max - min;
  const quarter = Math.max(1, Math.round(span / 4));
  switch (key) {
    case "+":
    case "=":
      return span < 4 ? null : [min + quarter, max - quarter];
    case "-":
    case "_":
      return [Math.max(0, min - 2 * quarter), max + 2 * quarter];
    case "ArrowLeft":
      return min <= 0 ? null : [Math.max(0, min - quarter), Math.max(0, min - quarter) + span];
    case "ArrowRight":
      return [min + quarter, max + quarter];
    default:
      return null;
  }
}

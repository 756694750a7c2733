/** What a key does to a focused chart's x range [min, max]: "+" (or "=") halves it around its middle, "-" doubles
 * it, the left and right arrows move it by a quarter, "0" asks for the whole run; any other key: null. */
export function zoomKey(key: string, min: number | null | undefined, max: number | null | undefined): [number, number] | "reset" | null {
  if (key === "0") return "reset";
  if (min == null || max == null || !(max > min)) return null;
  const span = max - min;
  const mid = (min + max) / 2;
  switch (key) {
    case "+":
    case "=":
      return span < 2 ? null : [mid - span / 4, mid + span / 4];
    case "-":
    case "_":
      return [Math.max(0, mid - span), mid + span];
    case "ArrowLeft":
      return min <= 0 ? null : [Math.max(0, min - span / 4), Math.max(0, min - span / 4) + span];
    case "ArrowRight":
      return [min + span / 4, max + span / 4];
    default:
      return null;
  }
}

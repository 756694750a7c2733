/** Width of a y axis's tick values: the widest label as the axis font draws it, plus the ticks and the gap, so
 * "9.73 MiB" or "10.0k" is never cut at the chart's left edge (a fixed width clipped the longer ones). */
export interface Measure {
  /** the width, in CSS pixels, of `text` in `font` */
  (text: string, font: string): number;
}

export const MIN_AXIS_PX = 40;

export function axisSize(values: string[] | null | undefined, font: string, measure: Measure, ticksPx: number,
  gapPx: number): number {
  const widest = Math.max(0, ...(values ?? []).filter((v) => v).map((v) => measure(v, font)));
  return Math.max(MIN_AXIS_PX, Math.ceil(ticksPx + gapPx + widest + 2));
}

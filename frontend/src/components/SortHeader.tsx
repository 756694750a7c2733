/** A sortable column header reachable by keyboard: a button inside the th (Enter and Space press it), and aria-sort
 * on the th so a screen reader says which column sorts and which way. */
export function SortHeader({ label, active, dir, onSort, className, testid }: {
  label: string; active: boolean; dir: 1 | -1; onSort: () => void; className?: string; testid?: string;
}) {
  return (
    <th className={`sortable ${className ?? ""}`} data-testid={testid}
      aria-sort={active ? (dir === 1 ? "ascending" : "descending") : "none"}>
      <button type="button" className="sort" onClick={onSort}>
        {label}{active ? (dir === 1 ? " ▲" : " ▼") : ""}
      </button>
    </th>
  );
}

import { QueryClient } from "@tanstack/react-query";
import type { Run } from "./api";

/** One cache for every page. An error is shown at once (no silent retries); a page polls where it says so. */
export const queryClient = new QueryClient({
  defaultOptions: { queries: { retry: false, refetchOnWindowFocus: false } },
});

/** A run the API answered after an action (approve, cancel, retry, labels): the run's own entry and every cached list
 * show it at once. A list poll already in flight predates the action: it is cancelled (its answer would put the old
 * state back for a moment, detaching the row's button a person is about to click); the next poll follows. */
export async function putRun(r: Run): Promise<void> {
  await queryClient.cancelQueries({ queryKey: ["runs"] });
  queryClient.setQueryData(["run", r.id], r);
  queryClient.setQueriesData<Run[]>({ queryKey: ["runs"] }, (rs) => rs?.map((x) => (x.id === r.id ? r : x)));
}

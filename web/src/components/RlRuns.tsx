// RL runs (staff): placeholder until the i13-api routes land.
export function RunList() {
  return <main id="main" class="page"><h1>RL runs</h1></main>;
}
export function RunView({ id }: { id: string; iteration: string | null }) {
  return <main id="main" class="page"><h1>RL run {id}</h1></main>;
}

// d3-flame-graph 4.1.3 is used from its ES sources (its dist is a UMD bundle); they carry no types.
declare module 'd3-flame-graph/src/flamegraph.js' {
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const flamegraph: () => any;
  export default flamegraph;
}
declare module 'd3-flame-graph/src/colorMapper.js' {
  export function differentialColorMapper(d: unknown, originalColor: string): string;
  export function offCpuColorMapper(d: unknown, originalColor: string): string;
}
declare module 'd3-selection' {
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  export function select(el: Element): any;
}
declare module '*.css';

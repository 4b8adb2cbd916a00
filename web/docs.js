// /docs: starts Swagger UI (its files are served from the swagger-ui-bundle-v2 package
// under /docs/static) on /openapi.json; a file of its own so the page needs no inline script.
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
